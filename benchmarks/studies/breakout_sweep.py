"""OpenES on Breakout-MinAtar: several seeds of several settings, the seeds vmapped.

    python benchmarks/studies/breakout_sweep.py [--settings FILE.json] [--seeds 4 | --seed-list 0,3]
        [--generations 1000] [--budget SECONDS] [--out sweep.jsonl] [--progress]

Each setting trains ``--seeds`` independent OpenES runs at once, the seeds a
vmapped axis of one compiled program, so an accelerator trains four seeds in
about the time of one. The policy is the project's (``evorl_pop.tasks.policies``:
the CNN, the MLP or the keypoints, greedy over the logits), the strategy
evosax's Open_ES built by :func:`evorl_pop.algorithms.es.make_strategy` (evosax's own draw),
ranked on the mean return of each candidate's episodes, capped at 500 steps;
after every generation the strategy's mean plays 8 episodes (the metric
``eval_return`` of ``examples/openes_minatar.py``).

A setting is a JSON object; its keys and defaults (those of
``examples/openes_minatar.py``)::

    policy "cnn" | "mlp" | "keypoints"; hidden [64];
    channels [] (keypoints: 3x3 convolutions whose maps' keypoints join the
    input channels'); activation "tanh"; population 128;
    learning_rate 0.05; sigma 0.1; episodes 1 (per candidate);
    weight_decay 0 (Adam with decoupled weight decay when > 0);
    temperature 0 (> 0: actions sampled from softmax(logits / temperature),
      in training and evaluation);
    sticky 0 (training only: the probability that the previous action is
      repeated instead, MinAtar's sticky actions);
    random_start 0 (training only: up to this many uniformly random actions
      at the start of each episode); vbn false (virtual batch normalisation,
      as ``virtual_batch_norm`` of the ES config); common false (common
      random numbers: in training every candidate's episodes start from the
      same keys); survival 0 (training only: the fitness adds this times the
      fraction of the 500 steps the episode lasted, so that among equal
      returns the longer rally ranks higher); init "flax" | "zero" | "seeded" (the
      strategy's initial mean: the network's own initialisation, the same
      for every seed, or every weight zero, as evosax's neuroevolution
      benchmarks start, or the network's initialisation drawn per seed, as
      the engine draws it); elite 0
      (> 0: the update follows only this fraction of the population, the
      best, with CMA-ES's logarithmic recombination weights; ties share the
      weight of their averaged rank, so a plateau of equal returns gets none:
      0 keeps evosax's centered ranks, where every candidate counts);
      novelty 0 (> 0: NSR-ES, Conti et al. 2018: the update follows
      (1 - novelty) times the centered rank of the return plus novelty times
      the centered rank of the candidate's novelty, the mean distance of its
      behaviour to its 10 nearest neighbours in an archive of the mean
      policy's past behaviours, one added per generation; a behaviour is the
      fraction of the episode's steps the paddle spent in each of the 10
      columns); generations (overrides --generations).

Without ``--settings`` it runs :data:`SETTINGS`. Prints one line per
setting: per seed the mean-policy return averaged over the last 50
generations, its maximum over the run, the best candidate's return, and the
environment steps of training.
"""

import argparse
import json
import time

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from evosax.algorithms import Open_ES
from evosax.core.fitness_shaping import (
    centered_rank_fitness_shaping_fn,
    identity_fitness_shaping_fn,
)
from jax.flatten_util import ravel_pytree

from evorl_pop.algorithms.es import elite_shaping, make_strategy
from evorl_pop.tasks.envs import make_env, random_observations
from evorl_pop.tasks.policies import CNN, MLP, Keypoints, Policy
from evorl_pop.tasks.vbn import VBN_BATCH, fold_virtual_batch_norm, vbn_reference

EPISODE_LENGTH = 500
EVAL_EPISODES = 8
DEFAULTS = dict(
    policy="cnn",
    hidden=[64],
    activation="tanh",
    population=128,
    learning_rate=0.05,
    sigma=0.1,
    episodes=1,
    weight_decay=0.0,
    temperature=0.0,
    sticky=0.0,
    random_start=0,
    vbn=False,
    common=False,
    survival=0.0,
    init="flax",
    elite=0.0,
    novelty=0.0,
    channels=[],
)
COLUMNS = 10  # of the Breakout-MinAtar board: the paddle's positions
NEIGHBOURS = 10  # novelty: the mean distance to this many nearest archived behaviours
ARCHIVE = 1000  # behaviours kept (one per generation), the oldest replaced first
SETTINGS = [
    dict(name="default"),
    dict(name="population 512", population=512),
    dict(name="population 1024, 500 generations", population=1024, generations=500),
    dict(name="population 256, 2 episodes", population=256, episodes=2),
    dict(
        name="population 256, lr 0.03, sigma 0.05", population=256, learning_rate=0.03, sigma=0.05
    ),
    dict(name="sampled actions (temperature 1)", temperature=1.0),
    dict(name="relu, temperature 0.5, pop 256", activation="relu", temperature=0.5, population=256),
    dict(name="MLP 64 on the flat image, pop 256", policy="mlp", population=256),
    dict(name="CNN, linear head, pop 256, lr 0.1", hidden=[], population=256, learning_rate=0.1),
    dict(name="sticky 0.1, pop 256", sticky=0.1, population=256),
    dict(name="sticky 0.25, pop 256", sticky=0.25, population=256),
    dict(name="random start 30, pop 256", random_start=30, population=256),
]


def build(setting, env, env_params):
    """``(init, generation, num_params)`` of one setting, for one seed."""
    s = {**DEFAULTS, **setting}
    obs_shape = env.observation_space(env_params).shape
    num_actions = env.num_actions
    if s["policy"] == "cnn":
        module = CNN(tuple(s["hidden"]), num_actions, s["activation"])
    elif s["policy"] == "keypoints":
        module = Keypoints(tuple(s["hidden"]), num_actions, s["activation"], tuple(s["channels"]))
    else:
        module = MLP(tuple(s["hidden"]), num_actions, s["activation"], obs_rank=len(obs_shape))
    flat0, unravel = ravel_pytree(module.init(jax.random.key(0), jnp.zeros(obs_shape)))
    if s["init"] not in ("flax", "zero", "seeded"):
        raise ValueError(f"init must be 'flax', 'zero' or 'seeded', got {s['init']!r}.")
    for name in ("elite", "novelty"):
        if not 0 <= s[name] <= 1:
            raise ValueError(f"{name} must be a fraction in [0, 1], got {s[name]!r}.")
    if s["elite"] and s["novelty"]:
        raise ValueError("elite and novelty each set the update's weights: choose one.")
    if s["init"] == "zero":
        flat0 = jnp.zeros_like(flat0)
    pop, episodes = s["population"], s["episodes"]
    if s["vbn"]:  # as ControlTask(..., virtual_batch_norm=True) does
        wrapped = make_env("Breakout-MinAtar")
        reference = jax.jit(lambda k: random_observations(wrapped, k, VBN_BATCH))(jax.random.key(0))
        policy = Policy(module, wrapped.spec)
        reference = jax.device_get(vbn_reference(policy, reference))
        fold = jax.vmap(
            lambda f: ravel_pytree(fold_virtual_batch_norm(policy, unravel(f), reference))[0]
        )
    else:
        fold = lambda f: f  # noqa: E731

    def act(flat, obs, key):
        logits = module.apply(unravel(flat), obs)
        if s["temperature"] > 0:
            return jax.random.categorical(key, logits / s["temperature"])
        return jnp.argmax(logits)

    def play(flats, key, train):
        """One episode per row of ``flats``: its return, its length in steps, and the
        fraction of those steps the paddle spent in each column."""
        width = flats.shape[0]
        flats = fold(flats)
        key, k_start, k_reset = jax.random.split(key, 3)
        sticky = s["sticky"] if train else 0.0
        random_steps = s["random_start"] if train else 0
        n_random = jax.random.randint(k_start, (width,), 0, random_steps + 1)
        if train and s["common"]:  # every candidate plays the same starts
            reset_keys = jnp.tile(jax.random.split(k_reset, episodes), (width // episodes,))
        else:
            reset_keys = jax.random.split(k_reset, width)
        obs, state = jax.vmap(env.reset_env, (0, None))(reset_keys, env_params)

        def running(c):
            return (c["t"] < EPISODE_LENGTH) & ~jnp.all(c["done"])

        def step(c):
            key, k_act, k_step, k_sticky, k_random = jax.random.split(c["key"], 5)
            a = jax.vmap(act)(flats, c["obs"], jax.random.split(k_act, width))
            a = jnp.where(c["t"] < n_random, jax.random.randint(k_random, (width,), 0, 3), a)
            a = jnp.where(jax.random.uniform(k_sticky, (width,)) < sticky, c["prev"], a)
            obs, state, r, d, _ = jax.vmap(env.step_env, (0, 0, 0, None))(
                jax.random.split(k_step, width), c["state"], a, env_params
            )
            return dict(
                obs=obs,
                state=state,
                done=c["done"] | d | (c["t"] + 1 >= EPISODE_LENGTH),
                ret=c["ret"] + jnp.where(c["done"], 0.0, r),
                length=c["length"] + ~c["done"],
                columns=c["columns"] + ~c["done"][:, None] * jax.nn.one_hot(state.pos, COLUMNS),
                t=c["t"] + 1,
                key=key,
                prev=a,
            )

        c = dict(
            obs=obs,
            state=state,
            done=jnp.zeros(width, bool),
            ret=jnp.zeros(width),
            length=jnp.zeros(width, jnp.int32),
            columns=jnp.zeros((width, COLUMNS)),
            t=0,
            key=key,
            prev=jnp.zeros(width, jnp.int32),
        )
        c = jax.lax.while_loop(running, step, c)
        return c["ret"], c["length"], c["columns"] / jnp.maximum(c["length"], 1)[:, None]

    shaping = {}
    if s["elite"] > 0:  # as ESConfig(elite=...) does
        shaping = dict(fitness_shaping_fn=elite_shaping(pop, s["elite"]))
    elif s["novelty"] > 0:  # the generation ranks returns and novelty itself
        shaping = dict(fitness_shaping_fn=identity_fitness_shaping_fn)
    if s["weight_decay"] > 0:
        strategy = Open_ES(
            pop,
            flat0,
            optimizer=optax.adamw(s["learning_rate"], weight_decay=s["weight_decay"]),
            std_schedule=optax.constant_schedule(s["sigma"]),
            **shaping,
        )
        params = strategy.default_params
    else:
        strategy, params = make_strategy(
            "Open_ES", pop, flat0.size, s["learning_rate"], s["sigma"], noise="normal", **shaping
        )

    def init(key):  # the strategy's state, the archive of behaviours and how many it holds
        start = flat0
        if s["init"] == "seeded":  # the network's initialisation drawn for this seed
            start = ravel_pytree(module.init(jax.random.fold_in(key, 1), jnp.zeros(obs_shape)))[0]
        return strategy.init(key, start, params), jnp.zeros((ARCHIVE, COLUMNS)), 0

    def novelty(behaviours, archive, count):
        distance = jnp.linalg.norm(behaviours[:, None] - archive[None], axis=-1)
        filled = jnp.arange(ARCHIVE) < count
        nearest = -jax.lax.top_k(-jnp.where(filled, distance, jnp.inf), NEIGHBOURS)[0]
        seen = jnp.isfinite(nearest)
        return jnp.where(seen, nearest, 0.0).sum(1) / jnp.maximum(seen.sum(1), 1)

    def generation(carry, key):
        state, archive, count = carry
        k_ask, k_play, k_tell, k_eval = jax.random.split(key, 4)
        x, state = strategy.ask(k_ask, state, params)
        returns, length, columns = play(jnp.repeat(x, episodes, axis=0), k_play, train=True)
        fitness = returns.reshape(pop, episodes).mean(1)
        bonus = s["survival"] * length.reshape(pop, episodes).mean(1) / EPISODE_LENGTH
        score = -(fitness + bonus)  # evosax minimises
        if s["novelty"] > 0:
            behaviours = columns.reshape(pop, episodes, COLUMNS).mean(1)
            ranked = [
                centered_rank_fitness_shaping_fn(None, -v, None, None)
                for v in (fitness + bonus, novelty(behaviours, archive, count))
            ]
            score = (1 - s["novelty"]) * ranked[0] + s["novelty"] * ranked[1]
        state, _ = strategy.tell(k_tell, x, score, state, params)
        mean = jnp.repeat(state.mean[None], EVAL_EPISODES, axis=0)
        eval_returns, _, eval_columns = play(mean, k_eval, train=False)
        archive = archive.at[count % ARCHIVE].set(eval_columns.mean(0))
        out = dict(best=fitness.max(), eval=eval_returns.mean(), steps=length.sum())
        return (state, archive, count + 1), out

    return init, generation, flat0.size


def run(setting, seeds, generations, env, env_params, chunk=50, progress=False):
    """Trains the runs ``seeds`` (indices) of one setting; returns the per-seed summary.

    Seed ``i`` draws from the ``i``-th of split keys, which does not depend on
    how many seeds run beside it, so a seed trains alike alone or with others.
    """
    init, generation, num_params = build(setting, env, env_params)
    generations = setting.get("generations", generations)
    seeds, count = jnp.asarray(seeds), max(seeds) + 1
    states = jax.jit(jax.vmap(init))(jax.random.split(jax.random.key(0), count)[seeds])

    @jax.jit
    def generations_of(states, key):
        def one(states, k):
            return jax.vmap(generation)(states, jax.random.split(k, count)[seeds])

        return jax.lax.scan(one, states, jax.random.split(key, chunk))

    start, key, history = time.perf_counter(), jax.random.key(123), []
    for _ in range(max(1, generations // chunk)):
        key, k = jax.random.split(key)
        states, out = generations_of(states, k)
        history.append(jax.tree.map(np.asarray, out))
        if progress:  # the mean policy over the chunk, per seed
            print(
                f"  generation {len(history) * chunk}, {time.perf_counter() - start:.0f} s: "
                f"{np.round(history[-1]['eval'].mean(0), 2).tolist()}",
                flush=True,
            )
    out = {name: np.concatenate([h[name] for h in history]) for name in history[0]}
    ev = out["eval"]  # (generations, seeds)
    return dict(
        setting=setting,
        num_params=int(num_params),
        seconds=round(time.perf_counter() - start, 1),
        env_steps=out["steps"].sum(0).tolist(),
        eval_last50=[round(float(v), 2) for v in ev[-50:].mean(0)],
        eval_curve=np.round(ev.T, 3).tolist(),
        eval_max=[round(float(v), 2) for v in ev.max(0)],
        best_candidate=[float(v) for v in out["best"].max(0)],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", help="JSON file with a list of settings")
    parser.add_argument("--seeds", type=int, default=4, help="train seeds 0..N-1")
    parser.add_argument("--seed-list", help="comma-separated seed indices instead, e.g. 0,3")
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument(
        "--budget", type=float, default=float("inf"), help="seconds: start no setting after"
    )
    parser.add_argument("--out", help="append one JSON line per setting to this file")
    parser.add_argument("--progress", action="store_true", help="print every 50 generations")
    args = parser.parse_args()
    settings = json.load(open(args.settings)) if args.settings else SETTINGS
    env, env_params = gymnax.make("Breakout-MinAtar")
    seeds = [int(i) for i in args.seed_list.split(",")] if args.seed_list else range(args.seeds)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; seeds {list(seeds)}")
    start = time.perf_counter()
    for setting in settings:
        if time.perf_counter() - start > args.budget:
            print(f"budget spent, skipped: {setting.get('name', setting)}")
            continue
        r = run(setting, list(seeds), args.generations, env, env_params, progress=args.progress)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
        steps = np.mean(r["env_steps"]) / 1e6
        print(
            f"{setting.get('name', setting)}: {r['num_params']:,} parameters, "
            f"{steps:.1f} M steps per seed, {r['seconds']} s in all; mean policy, "
            f"last 50 generations {r['eval_last50']}, best {r['eval_max']}; "
            f"best candidate {r['best_candidate']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
