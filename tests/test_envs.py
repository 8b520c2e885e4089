"""Environments and policies: every listed environment trains, brax tasks,
image observations, episode ends, and the errors for bad input."""

import functools
import subprocess
import sys

import _loop
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from evorl_pop import make_mesh
from evorl_pop.algorithms.es import ES, ESConfig
from evorl_pop.tasks import ControlTask
from evorl_pop.tasks.envs import env_names, make_env, random_observations
from evorl_pop.tasks.gymnax_envs import UNLISTED_GYMNAX
from evorl_pop.tasks.policies import CNN, MLP, Conv3x3, Keypoints, Policy, make_policy
from evorl_pop.tasks.rollout import rollout
from evorl_pop.tasks.vbn import fold_virtual_batch_norm, vbn_reference

BRAX = sorted(name for name in env_names() if name.startswith("brax/"))
# Playground's tasks train in tests/test_playground.py, Jumanji's in tests/test_jumanji.py
OWN_TESTS = ("brax/", "playground/", "jumanji:", "marl/")
GYMNAX = sorted(name for name in env_names() if not name.startswith(OWN_TESTS))
#: JaxMARL's tasks (a team per candidate; tests/test_marl.py steps them against JaxMARL):
#: in the exhaustive tier but one in the long tier, FACMAC's 6-agent task, whose declared
#: observation spaces are narrower than its observations.
MARL = sorted(name for name in env_names() if name.startswith("marl/"))

# tiny and cheap: 2 generations of 8 candidates, 8-step episodes, no evaluation
TINY = dict(population_size=8, hidden_sizes=(4,), episode_length=8, eval_episodes=0)


def _train(config, n=1, generations=2):
    es = ES(config, mesh=make_mesh(n))
    state, history = _loop.train(es, jax.random.key(0), generations)
    return es, state, {k: np.asarray(v) for k, v in history.items()}


# Every gymnax task in the default tier; of brax's, each with its own physics to compile
# (15-25 s on a CPU), one there and the rest in the exhaustive tier (hopper trains in
# test_brax_and_minatar_are_device_count_invariant, ant and walker2d in the QD tests)
SWEEP = (
    GYMNAX
    + [
        pytest.param(name, marks=[] if name == "brax/inverted_pendulum" else pytest.mark.exhaustive)
        for name in BRAX
    ]
    + [
        pytest.param(
            name, marks=pytest.mark.slow if "facmac_6a" in name else pytest.mark.exhaustive
        )
        for name in MARL
    ]
)


@pytest.mark.parametrize("name", SWEEP)
def test_every_listed_environment_trains(name):
    es, state, history = _train(ESConfig(task=name, **TINY))
    assert np.all(np.isfinite(history["fitness_mean"]))
    # every candidate ran one episode of at most episode_length steps, at least one step
    np.testing.assert_array_equal(history["episodes"], [8, 8])
    assert np.all((history["env_steps"] >= 8) & (history["env_steps"] <= 8 * 8))
    assert int(state.generation) == 2
    # the strategy told differing fitness moved its mean (8 steps can tie every candidate:
    # CartPole's always do, and a tie gives no direction)
    init = es.init(jax.random.split(jax.random.key(0))[0])
    assert np.all(np.isfinite(state.strategy_state.mean))
    if np.any(history["fitness_best"] > history["fitness_worst"]):
        assert not np.allclose(state.strategy_state.mean, init.strategy_state.mean)


def test_image_observations_get_a_cnn_and_others_a_flattened_mlp():
    kinds = {name: type(make_policy(make_env(name).spec).module) for name in GYMNAX}
    assert {n for n, k in kinds.items() if k is CNN} == {
        n for n in GYMNAX if n.endswith("-MinAtar") or n == "Pong-misc"
    }
    # a 10x5 grid is flattened: the MLP on it equals the MLP on the flat vector
    spec = make_env("Catch-bsuite").spec
    grid_policy = make_policy(spec, (8,))
    params = grid_policy.init(jax.random.key(1))
    obs = jax.random.normal(jax.random.key(2), spec.obs_shape)
    flat = MLP((8,), spec.action_dim, obs_rank=1).apply(params, obs.reshape(-1))
    np.testing.assert_allclose(grid_policy.module.apply(params, obs), flat, rtol=1e-6)
    # a batch of observations gives the batch of single outputs
    batch = jnp.stack([obs, obs + 1.0])
    np.testing.assert_allclose(
        grid_policy.module.apply(params, batch)[1],
        grid_policy.module.apply(params, obs + 1.0),
        rtol=1e-6,
    )


def _keypoint_readout(channels, out=None):
    """A linear Keypoints policy and parameters whose outputs are its keypoints
    (``out=None``) or ``keypoints @ out``."""
    n = 2 * channels
    module = Keypoints((), n if out is None else out.shape[1])
    params = module.init(jax.random.key(0), jnp.zeros((10, 10, channels)))
    dense = params["params"]["MLP_0"]["Dense_0"]
    dense["kernel"] = jnp.eye(n) if out is None else jnp.asarray(out, jnp.float32)
    dense["bias"] = jnp.zeros_like(dense["bias"])
    return module, params


def test_keypoints_are_where_lone_pixels_are():
    module, params = _keypoint_readout(3)
    image = np.zeros((2, 10, 10, 3), np.float32)  # a batch of two
    image[0, 2, 7, 0] = image[0, 9, 0, 1] = image[1, 5, 5, 0] = 1.0
    image[1, 5, 5, 1] = image[1, 4, 6, 1] = 1.0  # two pixels: their centroid
    # channel 2 is empty: its keypoint is the centre
    coords = np.linspace(-1.0, 1.0, 10)
    expected = [
        [coords[2], coords[9], 0.0, coords[7], coords[0], 0.0],  # rows, then columns
        [coords[5], (coords[5] + coords[4]) / 2, 0.0, coords[5], (coords[5] + coords[6]) / 2, 0.0],
    ]
    points = module.apply(params, jnp.asarray(image))
    assert points.shape == (2, 6)
    # a lone pixel holds 99.6 % of its channel's softmax: within 1e-2 of its position
    np.testing.assert_allclose(points, expected, atol=1e-2)
    # independent of the pixel's intensity, and of the batch
    np.testing.assert_allclose(
        module.apply(params, jnp.asarray(image[0] * 7.0)), points[0], atol=1e-5
    )
    # with learned feature maps: their keypoints join the channels', 2 * (3 + 5) inputs
    convolved = Keypoints((4,), 2, channels=(6, 5))
    conv_params = convolved.init(jax.random.key(1), jnp.asarray(image))
    assert conv_params["params"]["MLP_0"]["Dense_0"]["kernel"].shape == (16, 4)
    assert convolved.apply(conv_params, jnp.asarray(image)).shape == (2, 2)
    with pytest.raises(ValueError, match=r"policy='keypoints' needs image observations"):
        ESConfig(task="CartPole-v1", policy="keypoints").make_task()


class _FlaxCNN(nn.Module):
    """The reference: the CNN and keypoint convolutions with flax's own ``nn.Conv``."""

    channels: tuple
    padding: str

    @nn.compact
    def __call__(self, x):
        for width in self.channels:
            x = jnp.tanh(nn.Conv(width, (3, 3), padding=self.padding)(x))
        return x


class _ProjectCNN(nn.Module):
    channels: tuple
    padding: str
    method: str

    @nn.compact
    def __call__(self, x):
        for i, width in enumerate(self.channels):
            x = jnp.tanh(Conv3x3(width, self.padding, self.method, name=f"Conv_{i}")(x))
        return x


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
@pytest.mark.parametrize("method", ["patches", "xla"])
def test_conv3x3_is_flax_conv(padding, method):
    """Same parameters and initial values as ``nn.Conv``, same outputs and gradients,
    also inside a ``scan`` of gradient steps (where the patches are the fast CPU path)."""
    x = jax.random.uniform(jax.random.key(0), (4, 5, 10, 10, 3))  # 4 minibatches of 5 images
    ref, ours = _FlaxCNN((6, 4), padding), _ProjectCNN((6, 4), padding, method)
    params = ref.init(jax.random.key(1), x[0])
    ours_params = ours.init(jax.random.key(1), x[0])
    assert jax.tree.structure(ours_params) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, ours_params, params)  # bit for bit
    np.testing.assert_allclose(ours.apply(params, x[0]), ref.apply(params, x[0]), atol=1e-6)

    def descend(module):
        def step(p, xb):
            grad = jax.grad(lambda p: jnp.sum(module.apply(p, xb) ** 2))(p)
            return jax.tree.map(lambda a, g: a - 0.01 * g, p, grad), None

        return jax.jit(lambda p: jax.lax.scan(step, p, x)[0])(params)

    jax.tree.map(
        functools.partial(np.testing.assert_allclose, atol=2e-5), descend(ours), descend(ref)
    )
    with pytest.raises(ValueError, match=r"Unknown conv method 'fft'"):
        _ProjectCNN((2,), padding, "fft").init(jax.random.key(1), x[0])


def test_mlp_initialises_as_flax_dense_layers():
    """``MLP``'s layers start as flax's ``nn.Dense`` defaults (LeCun normal, zero
    bias), its output layer times ``out_scale``: checkpoints of ES policies and
    learners written before the option stay what they were."""

    class Dense2(nn.Module):
        @nn.compact
        def __call__(self, x):
            hidden = jnp.tanh(nn.Dense(8)(x))
            return nn.Dense(3)(hidden)

    key = jax.random.key(2)
    x = jnp.ones(5)
    ref = Dense2().init(key, x)
    jax.tree.map(np.testing.assert_array_equal, MLP((8,), 3).init(key, x), ref)
    scaled, ref = MLP((8,), 3, out_scale=0.01).init(key, x)["params"], ref["params"]
    np.testing.assert_array_equal(scaled["Dense_0"]["kernel"], ref["Dense_0"]["kernel"])
    out = scaled["Dense_1"]["kernel"]
    np.testing.assert_allclose(out, 0.01 * ref["Dense_1"]["kernel"], rtol=1e-6)


def test_cnn_initialises_and_computes_as_with_flax_conv():
    """The policy CNN's parameters, and so its checkpoints, are those it had with ``nn.Conv``."""
    image = jax.random.uniform(jax.random.key(0), (7, 10, 10, 4))
    flax_params = _FlaxCNN((16,), "VALID").init(jax.random.key(2), image)["params"]["Conv_0"]
    for conv in ("auto", "patches", "xla"):
        module = CNN((8,), 3, conv=conv)
        params = module.init(jax.random.key(2), image)["params"]
        jax.tree.map(np.testing.assert_array_equal, params["Conv_0"], flax_params)
        features = nn.Conv(16, (3, 3), padding="VALID").apply({"params": flax_params}, image)
        expected = MLP((8,), 3, "relu", obs_rank=3).apply(
            {"params": params["MLP_0"]}, nn.relu(features)
        )
        np.testing.assert_allclose(module.apply({"params": params}, image), expected, atol=1e-5)


def test_keypoint_policy_that_follows_the_ball_clears_breakout_bricks():
    """Left minus right logit proportional to the paddle's column minus the ball's:
    the linear keypoint policy that follows the ball never misses it. Breakout-MinAtar's
    channels are paddle, ball, trail, bricks; the keypoints their rows, then columns."""
    env = make_env("Breakout-MinAtar", episode_length=300)
    policy = make_policy(env.spec, (), kind="keypoints")
    assert type(policy.module) is Keypoints
    towards = np.zeros(8)
    towards[4], towards[5] = 1.0, -1.0  # paddle column minus ball column
    out = np.zeros((8, 3))
    out[:, 1], out[:, 2] = 20 * towards, -20 * towards  # actions: none, left, right
    module, params = _keypoint_readout(4, out)
    params["params"]["MLP_0"]["Dense_0"]["bias"] = jnp.array([1.0, 0.0, 0.0])
    keys = jax.random.split(jax.random.key(0), 8)  # both sides the ball starts from
    follow = jax.vmap(lambda k: rollout(env, policy, params, k))(keys)
    sides = {int(env.reset(jax.random.split(k)[1])[1].ball_x) for k in keys}  # as rollout
    assert sides == {0, 9}, sides
    # it never misses: every episode lasts its 300 steps, a brick about every 12
    np.testing.assert_array_equal(follow.steps, 300)
    assert np.all(np.asarray(follow.episode_return) >= 20), follow.episode_return
    params["params"]["MLP_0"]["Dense_0"]["kernel"] = -params["params"]["MLP_0"]["Dense_0"]["kernel"]
    away = jax.vmap(lambda k: rollout(env, policy, params, k))(keys)  # runs from the ball
    assert np.all(np.asarray(away.episode_return) <= 2), away.episode_return


def _vbn_forward(module, params, reference, obs, eps=1e-5):
    """Virtual batch normalisation as defined: the reference batch goes through the
    network beside the input, each hidden layer normalised with the batch's statistics."""
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[module.activation]
    layers = params["params"]
    x = obs[None]
    ref = reference

    def layer(apply, axes):
        nonlocal x, ref
        pre_ref, pre_x = apply(ref), apply(x)
        mu, var = pre_ref.mean(axes), pre_ref.var(axes)
        ref, x = act((pre_ref - mu) / jnp.sqrt(var + eps)), act((pre_x - mu) / jnp.sqrt(var + eps))

    for i in range(len(module.channels) if isinstance(module, CNN) else 0):
        conv = layers[f"Conv_{i}"]
        kernel = conv["kernel"].transpose(3, 2, 0, 1)  # HWIO as OIHW
        layer(
            lambda v, c=conv, k=kernel: (
                jax.lax.conv(v.transpose(0, 3, 1, 2), k, (1, 1), "VALID").transpose(0, 2, 3, 1)
                + c["bias"]
            ),
            (0, 1, 2),
        )
    layers = layers["MLP_0"] if isinstance(module, CNN) else layers
    x, ref = x.reshape(1, -1), ref.reshape(len(ref), -1)
    for j in range(len(module.hidden_sizes)):
        dense = layers[f"Dense_{j}"]
        layer(lambda v, d=dense: v @ d["kernel"] + d["bias"], 0)
    out = layers[f"Dense_{len(module.hidden_sizes)}"]
    return (x @ out["kernel"] + out["bias"])[0]


@pytest.mark.parametrize("name, kind", [("Breakout-MinAtar", "cnn"), ("Acrobot-v1", "mlp")])
def test_virtual_batch_norm_is_folded_into_the_weights(name, kind):
    env = make_env(name)
    reference = jax.jit(lambda k: random_observations(env, k, 64))(jax.random.key(0))
    assert reference.shape == (64, *env.spec.obs_shape)
    assert len(np.unique(np.asarray(reference).reshape(64, -1), axis=0)) > 32  # varied states
    policy = make_policy(env.spec, (16, 8), kind=kind)
    params = policy.init(jax.random.key(1))
    folded = fold_virtual_batch_norm(policy, params, reference)
    for obs in reference[:3]:
        np.testing.assert_allclose(
            policy.module.apply(folded, obs),
            _vbn_forward(policy.module, params, reference, obs),
            rtol=2e-4,
            atol=2e-5,
        )
    # normalised layers do not depend on the scale of the weights before them
    # (up to eps, here negligible)
    folded = fold_virtual_batch_norm(policy, params, reference, eps=1e-12)
    scaled = jax.tree.map(lambda x: x, params)
    first = scaled["params"]["Conv_0" if kind == "cnn" else "Dense_0"]
    first["kernel"], first["bias"] = 7.0 * first["kernel"], 7.0 * first["bias"]
    np.testing.assert_allclose(
        policy.module.apply(fold_virtual_batch_norm(policy, scaled, reference, 1e-12), reference),
        policy.module.apply(folded, reference),
        rtol=1e-4,
        atol=1e-5,
    )
    # the candidate's own weights are left as they were
    np.testing.assert_array_equal(
        ravel_pytree(params)[0], ravel_pytree(policy.init(jax.random.key(1)))[0]
    )


@pytest.mark.parametrize(
    "module",
    [
        CNN((16,), 3, "tanh", channels=(8, 4)),
        CNN((), 3, "tanh"),
        MLP((16, 8), 3, "relu", obs_rank=3),
        MLP((), 3, obs_rank=3),
    ],
    ids=["two-convolutions", "linear-head", "mlp", "linear-mlp"],
)
def test_virtual_batch_norm_folds_a_population_as_each_candidate_alone(module, monkeypatch):
    env = make_env("Breakout-MinAtar")
    policy = Policy(module, env.spec)
    refs = jax.jit(jax.vmap(lambda k: random_observations(env, k, 32)))(
        jax.random.split(jax.random.key(0), 5)
    )
    reference = refs[0]
    population = jax.vmap(policy.init)(jax.random.split(jax.random.key(1), 5))
    candidates = [jax.tree.map(lambda x, i=i: x[i], population) for i in range(5)]
    fold_one = jax.jit(lambda p, r: fold_virtual_batch_norm(policy, p, r))
    alone = [fold_one(p, reference) for p in candidates]
    defined = jax.jit(lambda p, obs: _vbn_forward(policy.module, p, reference, obs))
    for folded, params in zip(alone[:2], candidates, strict=False):  # as defined, layer by layer
        np.testing.assert_allclose(
            jax.vmap(lambda obs, f=folded: policy.module.apply(f, obs))(reference[:4]),
            jax.vmap(lambda obs, p=params: defined(p, obs))(reference[:4]),
            rtol=2e-4,
            atol=2e-5,
        )
    prepared = vbn_reference(policy, reference)
    together = {
        # the engine's case: one reference for every candidate (folded a few at a time)
        "shared": jax.jit(jax.vmap(lambda p: fold_virtual_batch_norm(policy, p, prepared)))(
            population
        ),
        # a reference per candidate
        "own": jax.jit(jax.vmap(lambda p, r: fold_virtual_batch_norm(policy, p, r)))(
            population, jnp.stack([reference] * 5)
        ),
    }
    with monkeypatch.context() as patch:  # an accelerator folds them all at once
        patch.setattr(jax, "default_backend", lambda: "gpu")
        together["at once"] = jax.jit(
            jax.vmap(lambda p: fold_virtual_batch_norm(policy, p, prepared))
        )(population)
    for folded in together.values():
        for i in range(5):
            np.testing.assert_allclose(
                ravel_pytree(jax.tree.map(lambda x, i=i: x[i], folded))[0],
                ravel_pytree(alone[i])[0],
                rtol=1e-4,
                atol=1e-5,
            )
    if not module.hidden_sizes and isinstance(module, MLP):  # only an output layer: as it was
        np.testing.assert_array_equal(ravel_pytree(alone[0])[0], ravel_pytree(candidates[0])[0])
    own = jax.jit(jax.vmap(lambda p, r: fold_virtual_batch_norm(policy, p, r)))(population, refs)
    np.testing.assert_allclose(
        ravel_pytree(jax.tree.map(lambda x: x[3], own))[0],
        ravel_pytree(fold_one(candidates[3], refs[3]))[0],
        rtol=1e-4,
        atol=1e-5,
    )


def test_virtual_batch_norm_needs_a_built_in_policy():
    import flax.linen as nn

    class Linear(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    with pytest.raises(ValueError, match=r"built-in mlp and cnn policies, not a Linear"):
        ControlTask("CartPole-v1", policy_module=Linear(), virtual_batch_norm=True)


def test_unlisted_environment_says_why():
    assert "MNISTBandit-bsuite" in UNLISTED_GYMNAX
    with pytest.raises(ValueError, match=r"'MNISTBandit-bsuite' is not offered: it downloads"):
        make_env("MNISTBandit-bsuite")


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, extra",
    [
        ("brax/hopper", dict(normalize_obs=True)),
        ("Breakout-MinAtar", dict(episode_length=20)),
        ("Breakout-MinAtar", dict(episode_length=20, normalize_obs=True, virtual_batch_norm=True)),
    ],
)
def test_brax_and_minatar_are_device_count_invariant(task, extra):
    config = ESConfig(task=task, **{**TINY, **extra})
    _, one, h1 = _train(config, n=1)
    _, two, h2 = _train(config, n=2)
    for k in ("env_steps", "episodes"):
        np.testing.assert_array_equal(h2[k], h1[k])
    for k in ("fitness_best", "fitness_mean", "fitness_worst"):
        # The first generation's policies and normaliser are the same on any device
        # count. After it, the merged observation statistics and the update may
        # differ in the last bit (summation order), which hopper's contacts amplify
        # to about 1e-4 of a return in a few steps.
        np.testing.assert_allclose(h2[k][0], h1[k][0], rtol=1e-6)
        np.testing.assert_allclose(h2[k], h1[k], rtol=1e-3)
    np.testing.assert_allclose(two.strategy_state.mean, one.strategy_state.mean, atol=1e-6)
    if config.normalize_obs:  # the normaliser saw every observation once, on any device count
        assert float(one.task_state.count) == float(h1["env_steps"].sum())
        # (the second generation's observations differ as its returns do; a
        # device-dependent key or sum would differ at 1e-1, not 1e-4)
        np.testing.assert_allclose(two.task_state.mean, one.task_state.mean, rtol=1e-3, atol=1e-5)


def test_fallen_brax_body_stops_accumulating_reward_and_steps():
    """inverted_pendulum pushed hard one way falls within a few steps; after the
    fall the rollout adds neither reward nor steps, and the env stays frozen."""
    env = make_env("brax/inverted_pendulum", episode_length=100)
    push = lambda params, obs: jnp.ones(env.spec.action_dim)  # noqa: E731
    stats = jax.jit(lambda key: rollout(env, push, None, key))(jax.random.key(3))

    # reference: raw brax steps until brax's own done
    raw = env.env
    step = jax.jit(raw.step)
    state = jax.jit(raw.reset)(jax.random.key(3))
    total = 0.0
    steps = 0
    while steps < 100:
        state = step(state, jnp.ones(env.spec.action_dim))
        total += float(state.reward)
        steps += 1
        if state.done:
            break
    assert steps < 50, "the pushed pendulum should fall early"
    assert int(stats.steps) == steps
    np.testing.assert_allclose(float(stats.episode_return), total, rtol=1e-5)

    # stepping the wrapper past the end: done stays set, no reward, same observation
    obs, wstate = env.reset(jax.random.key(3))
    wstep = jax.jit(env.step)
    for _ in range(steps + 3):
        last_obs = obs
        obs, wstate, reward, done = wstep(None, wstate, jnp.ones(env.spec.action_dim))
    assert bool(done) and float(reward) == 0.0
    np.testing.assert_array_equal(obs, last_obs)


def test_episode_length_is_honoured():
    env = make_env("brax/reacher", episode_length=7)  # reacher never terminates early
    assert env.spec.max_steps == 7
    stats = rollout(env, lambda p, o: jnp.zeros(2), None, jax.random.key(0))
    assert int(stats.steps) == 7
    assert make_env("CartPole-v1", episode_length=9).spec.max_steps == 9
    # gymnax environments end the episode themselves at the new limit
    stats = rollout(
        make_env("Pendulum-v1", episode_length=5),
        lambda p, o: jnp.zeros(1),
        None,
        jax.random.key(0),
        episode_length=20,
    )
    assert int(stats.steps) == 5


def test_brax_name_without_brax_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)
    monkeypatch.setitem(sys.modules, "brax.envs", None)
    with pytest.raises(ValueError, match=r"brax tasks need brax.*pip install -e '\.\[brax\]'"):
        ESConfig(task="brax/hopper").make_task()


def test_brax_tasks_start_without_third_party_noise():
    # a fresh process: brax and mujoco print their notices on first import
    code = "from evorl_pop.tasks import make_env; make_env('brax/inverted_pendulum')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "warp" not in result.stderr and "maintained" not in result.stderr, result.stderr


def test_policy_that_does_not_fit_the_observation():
    with pytest.raises(ValueError, match=r"policy='cnn' needs image observations.*policy='mlp'"):
        ESConfig(task="CartPole-v1", policy="cnn").make_task()
    with pytest.raises(ValueError, match=r"Unknown policy 'conv'"):
        ESConfig(task="Breakout-MinAtar", policy="conv").make_task()
    # an MLP on an image is allowed (flattened)
    assert type(ControlTask("Breakout-MinAtar", policy="mlp").policy.module) is MLP


def test_unknown_brax_backend():
    with pytest.raises(ValueError, match=r"Unknown brax backend 'springy'.*'spring'"):
        ESConfig(task="brax/hopper", backend="springy").make_task()


# ERL's in the exhaustive tier, beside the matrix's brax column
@pytest.mark.parametrize("algorithm", ["cemrl", pytest.param("erl", marks=pytest.mark.exhaustive)])
def test_hybrid_algorithms_run_on_a_brax_task(algorithm):
    from evorl_pop.algorithms import cemrl, erl
    from evorl_pop.rl import TD3Config

    tiny = dict(
        task="brax/inverted_pendulum",
        population_size=4,
        num_elites=2,
        learning_starts=20,  # reached in the first generation
        episode_length=10,
        eval_episodes=1,
        td3=TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(16,), batch_size=8),
    )
    if algorithm == "cemrl":
        algo = cemrl.CEMRL(cemrl.Config(num_rl_actors=2, updates_per_actor=2, **tiny))
    else:
        algo = erl.ERL(erl.Config(updates_per_generation=2, **tiny))
    step = jax.jit(algo.step)
    state = algo.init(jax.random.key(0))
    history = []
    for key in jax.random.split(jax.random.key(1), 2):
        state, metrics = step(state, key)
        history.append({k: np.asarray(v) for k, v in metrics.items() if np.ndim(v) == 0})
    for metrics in history:
        for k in ("fitness_best", "fitness_mean", "eval_return"):
            assert np.isfinite(metrics[k]), (k, metrics[k])
        # an episode per actor (ERL: and one of its learner), cut at episode_length
        episodes = metrics["episodes"]
        assert episodes in (4, 5) and episodes <= metrics["env_steps"] <= 10 * episodes
    # TD3 learned from the brax transitions by the second generation
    assert np.isfinite(history[1]["critic_loss"]) and np.isfinite(history[1]["actor_loss"])
