"""The plug-ins of ``examples/plugins/``, run as a user runs them (``evorl-pop`` with
``--plugin`` and the folder on ``PYTHONPATH``): train, resume, render. And every kind
of plug-in that lacks a part its protocol declares is refused in one line as it
registers (or as it is built), before anything compiles."""

import dataclasses
import re
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from _env import cli_env, run_cli, with_path

from evorl_pop import registry
from evorl_pop.run import store

EXAMPLES = Path(__file__).parent.parent / "examples" / "plugins"


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """``evorl-pop ARGS`` as a user runs it, the example plug-ins' folder on the path."""
    return run_cli(*args, env=with_path(cli_env(), EXAMPLES), cwd=cwd)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _train_resume_render(run: Path, *args) -> tuple[dict, dict, str]:
    """``train ARGS``, then ``resume --more 1`` and ``render``: ``(metrics after train,
    after resume, render's output)``."""
    _ok(_cli("train", "-q", "--no-figure", "--devices", "1", "--out", str(run), *args))
    trained = store.read_metrics(run)
    # the run folder records the plug-in: resume and render need no --plugin
    _ok(_cli("resume", str(run), "-q", "--no-figure", "--more", "1"))
    resumed = store.read_metrics(run)
    np.testing.assert_array_equal(
        resumed["generation"], np.arange(1, len(trained["generation"]) + 2)
    )
    for column in ("fitness_best", "fitness_mean"):
        np.testing.assert_array_equal(resumed[column][:-1], trained[column])
    drawn = _ok(_cli("render", str(run), "--episodes", "1"))
    return trained, resumed, drawn


# --- each plug-in through the command line -------------------------------------------


def test_every_plugin_registers_and_is_listed():
    modules = ["one_plus_lambda", "cross_entropy", "spring_env", "reinforce"]
    listed = _ok(_cli("list", *[arg for m in modules for arg in ("--plugin", m)]))
    sections = dict(re.findall(r"^(\S[^\n]*):\n((?:  [^\n]*\n?)*)", listed, re.M))
    algorithms = sections["algorithms"]
    assert re.search(r"^  cross_entropy +the cross-entropy method", algorithms, re.M)
    assert re.search(r"^  reinforce +REINFORCE on its own", algorithms, re.M)
    assert "OnePlusLambda" in sections["strategies (es --strategy)"].replace(",", " ").split()
    learners = sections["learners (cemrl, erl, pbt: --set learner=NAME)"]
    assert "reinforce" in learners.replace(",", " ").split()
    assert "spring/mass" in sections["environments (--task)"].replace(",", " ").split()
    families = "environment families (--task NAME; --set SETTING=VALUE for a family's own)"
    assert "  spring: a mass on a spring to bring to rest (spring/mass)" in sections[families]


@pytest.mark.slow
def test_the_strategy_plugin_trains_in_es(tmp_path):
    args = ["--plugin", "one_plus_lambda", "--strategy", "OnePlusLambda", "--task", "sphere"]
    args += ["--set", "num_dims=5", "--set", "sigma_init=0.5", "--pop", "8", "-g", "30"]
    trained, _, drawn = _train_resume_render(tmp_path / "run", *args)
    # sphere at x0 = 3 in 5-D starts near 45; its optimum is 0
    assert trained["fitness_best"][0] > 20
    assert trained["fitness_best"][-1] < 0.05 * trained["fitness_best"][0]
    assert trained["sigma"][-1] < 0.5  # the 1/5th rule shrank the step size near the optimum
    assert (
        drawn.strip() == "nothing to render: 'sphere' is a black-box function, not an environment."
    )


@pytest.mark.slow
def test_the_algorithm_plugin_trains(tmp_path):
    args = ["--plugin", "cross_entropy", "-a", "cross_entropy", "--task", "sphere"]
    args += ["--set", "num_dims=4", "--pop", "16", "-g", "20", "--seed", "2"]
    trained, _, drawn = _train_resume_render(tmp_path / "run", *args)
    # sphere at x0 = 3 in 4-D: 36 at the first mean; the elites' mean closes in on 0
    assert trained["fitness_mean"][0] > 20
    assert trained["best_so_far"][-1] < 0.01 * trained["fitness_mean"][0]
    assert trained["sigma"][-1] < 0.2  # the Gaussian narrowed around the optimum
    np.testing.assert_array_equal(
        trained["best_so_far"], np.minimum.accumulate(trained["fitness_best"])
    )
    assert (
        drawn.strip() == "nothing to render: 'sphere' is a black-box function, not an environment."
    )


@pytest.mark.slow
def test_the_environment_family_plugin_trains_es_and_renders(tmp_path):
    run = tmp_path / "run"
    args = ["--plugin", "spring_env", "--task", "spring/mass", "--pop", "16", "-g", "15"]
    args += ["--seed", "0", "--set", "hidden_sizes=[]", "--set", "episode_length=50"]
    trained, _, drawn = _train_resume_render(run, *args)
    returns = trained["eval_return"]
    assert returns[-5:].mean() > returns[:3].mean() + 20, returns  # ES damps the spring
    assert drawn.startswith(f"wrote {run / 'render.gif'} (50 frames)"), drawn


@pytest.mark.slow
def test_the_learner_plugin_trains_on_its_own_and_renders(tmp_path):
    run = tmp_path / "run"
    args = ["--plugin", "reinforce", "-a", "reinforce", "--task", "CartPole-v1", "-g", "8"]
    args += ["--set", "interval=1600", "--set", "episode_length=100", "--seed", "0"]
    trained, _, drawn = _train_resume_render(run, *args)
    returns = trained["eval_return"]
    assert returns[0] < 40 and returns[-1] > 60, returns  # of 100 at most
    assert drawn.startswith(f"wrote {run / 'render.gif'} (100 frames)"), drawn


@pytest.mark.slow
def test_the_learner_plugin_as_pbt_members(tmp_path):
    args = ["--plugin", "reinforce", "-a", "pbt", "--set", "learner=reinforce"]
    args += ["--task", "CartPole-v1", "--pop", "4", "--set", "interval=800", "-g", "2"]
    args += ["--set", "episode_length=50", "--set", "learner_settings.episodes=4"]
    _ok(_cli("train", "-q", "--no-figure", "--devices", "1", "--out", str(tmp_path), *args))
    metrics = store.read_metrics(tmp_path)
    assert np.all(np.isfinite(metrics["reinforce_loss"]))
    members = np.stack([metrics[f"member{i}_return"] for i in range(4)])
    np.testing.assert_allclose(metrics["fitness_best"], members.max(axis=0))
    rates = np.stack([metrics[f"member{i}_learning_rate"] for i in range(4)])
    assert np.all((rates >= 1e-3) & (rates <= 3e-2 * 1.2**2)), rates


# --- a plug-in lacking a part is refused as it registers -------------------------------

BROKEN_STRATEGY = """
from evorl_pop import registry


class OnePlusLambda:
    def __init__(self, population_size, solution):
        self.population_size, self.num_dims = population_size, solution.size

    default_params = None

    def init(self, key, solution, params): ...
    def ask(self, key, state, params): ...
    def get_mean(self, state): ...


registry.register_strategy("OnePlusLambda", OnePlusLambda)
"""

STRATEGY_LACKS_TELL = (
    "register_strategy('OnePlusLambda'): OnePlusLambda lacks tell (core.interfaces.Strategy "
    "declares population_size, num_dims, default_params, init, ask, tell, get_mean)"
)


def test_a_broken_plugin_stops_the_command_in_one_line_before_a_run_begins(tmp_path):
    (tmp_path / "broken_es.py").write_text(BROKEN_STRATEGY)
    run = tmp_path / "run"
    result = _cli(
        "train",
        "--plugin",
        "broken_es",
        "--strategy",
        "OnePlusLambda",
        "--out",
        str(run),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr == f"evorl-pop train: config error: plugins: {STRATEGY_LACKS_TELL}\n"
    assert not run.exists()


def test_a_strategy_lacking_a_method_is_refused(monkeypatch):
    namespace = {}
    exec(BROKEN_STRATEGY.replace("registry.register_strategy", "# "), namespace)
    cls = namespace["OnePlusLambda"]
    with pytest.raises(registry.PluginError) as err:
        registry.register_strategy("OnePlusLambda", cls)
    assert str(err.value) == STRATEGY_LACKS_TELL
    assert "OnePlusLambda" not in registry.STRATEGIES._entries
    with pytest.raises(registry.PluginError, match=r"^register_strategy\('f'\): takes a class"):
        registry.register_strategy("f", lambda population_size, solution: None)


def test_a_strategy_built_without_an_attribute_is_refused_before_it_runs(monkeypatch):
    from evorl_pop.algorithms.es import make_strategy

    class NoDims:  # every method, but no num_dims once built
        def __init__(self, population_size, solution):
            self.population_size = population_size

        default_params = None
        init = ask = tell = get_mean = staticmethod(lambda *args: None)

    monkeypatch.setattr(registry.STRATEGIES, "_entries", dict(registry.STRATEGIES._entries))
    registry.register_strategy("NoDims", NoDims)  # num_dims may be set in __init__
    with pytest.raises(registry.PluginError) as err:
        make_strategy("NoDims", 8, 3)
    assert str(err.value).startswith("strategy 'NoDims': the NoDims built lacks num_dims (")


def test_an_algorithm_lacking_a_part_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Config:
        task: str = "sphere"

        def validate(self): ...

    class NoStep:
        def __init__(self, config, mesh=None): ...
        def init(self, key): ...

    class NoMesh:
        def __init__(self, config): ...
        def init(self, key): ...
        def step(self, state, key): ...

    class Plain:  # not a dataclass, no validate
        task = "sphere"

    with pytest.raises(registry.PluginError) as err:
        registry.register_algorithm("mine", Config, NoStep)
    assert str(err.value) == (
        "register_algorithm('mine'): NoStep lacks step (core.interfaces.Algorithm declares "
        "init, step)"
    )
    with pytest.raises(
        registry.PluginError, match=r"NoMesh is not built as NoMesh\(config, mesh=None\)"
    ):
        registry.register_algorithm("mine", Config, NoMesh)
    with pytest.raises(registry.PluginError) as err:
        registry.register_algorithm("mine", Plain, NoMesh)
    assert str(err.value).startswith(
        "register_algorithm('mine'): Plain is not a dataclass and lacks validate"
    )
    assert "mine" not in registry.ALGORITHMS._entries


def test_a_learner_lacking_a_part_is_refused():
    from evorl_pop.rl.hybrid import ReplayLearner

    @dataclasses.dataclass(frozen=True)
    class Settings:
        batch_size: int = 8

        def validate(self): ...

    class NoWithActor(ReplayLearner):  # the base gives the buffer, the gate, train_actors
        def init(self, key): ...
        def actor(self, state): ...
        def shared(self, state): ...

    hybrid = registry.HybridPart(Settings(), lambda config, settings: None, NoWithActor)
    with pytest.raises(registry.PluginError) as err:
        registry.register_learner("mine", registry.LearnerSpec(hybrid=hybrid))
    message = str(err.value)
    assert message.startswith(
        "register_learner('mine') hybrid.learner: NoWithActor lacks with_actor "
        "(core.interfaces.ReplayLearner declares LOSSES, init, init_shared, actor, shared, "
    )
    assert "\n" not in message

    @dataclasses.dataclass(frozen=True)
    class NoValidate:
        episodes: int = 4

    member = registry.MemberPart(NoValidate(), lambda settings, config: None, ("lr",))
    with pytest.raises(registry.PluginError) as err:
        registry.register_learner("mine", registry.LearnerSpec(member=member))
    assert str(err.value) == (
        "register_learner('mine') member.defaults: NoValidate lacks validate "
        "(settings are a dataclass with validate)"
    )
    searched = dataclasses.replace(
        member, defaults=Settings(), default_search=(("gamma", 0.9, 1.0, False),)
    )
    with pytest.raises(
        registry.PluginError, match=r"default_search names gamma, not in member.searchable \(lr\)"
    ):
        registry.register_learner("mine", registry.LearnerSpec(member=searched))
    assert "mine" not in registry.LEARNERS._entries


def test_an_environment_family_lacking_a_part_is_refused():
    from evorl_pop.tasks.control import JaxEnvFamily

    class NoDrawing:  # not a JaxEnvFamily: it declares everything itself, but drawing and draw
        description, pattern, settings, steps_in_jax, example = "mine", "mine/<x>", {}, True, None

        def names(self):
            return ("mine/x",)

        def owns(self, name):
            return name == "mine/x"

        def make_env(self, name, **settings): ...
        def make_task(self, name, **kwargs): ...

    with pytest.raises(registry.PluginError) as err:
        registry.register_env_family("mine", NoDrawing())
    assert str(err.value) == (
        "register_env_family('mine'): NoDrawing lacks drawing, draw (core.interfaces.EnvFamily "
        "declares description, pattern, settings, steps_in_jax, drawing, example, names, owns, "
        "make_env, make_task, draw)"
    )

    class Line(JaxEnvFamily):
        description, pattern = "a line", "line/<x>"

    with pytest.raises(registry.PluginError, match=r"takes an instance, got the class Line"):
        registry.register_env_family("line", Line)
    assert "mine" not in registry.ENV_FAMILIES._entries


def test_a_task_lacking_a_part_is_refused_before_it_runs():
    from evorl_pop.algorithms.es import ES, ESConfig

    class NoUpdate:  # the own-task guide's task without update_state
        name, num_dims, maximize = "shifted-sphere", 4, False

        def init_solution(self, key):
            return jnp.zeros(self.num_dims)

        def init_state(self):
            return ()

        def evaluate(self, solution, key, task_state): ...

    config = ESConfig(strategy="SNES", task="sphere", num_dims=4, population_size=8)
    with pytest.raises(registry.PluginError) as err:
        ES(config, task=NoUpdate())
    assert str(err.value) == (
        "ES(config, task=...): the NoUpdate built lacks update_state (core.interfaces.Task "
        "declares name, num_dims, maximize, init_solution, init_state, update_state, evaluate)"
    )


def test_a_familys_task_lacking_a_part_is_refused_before_it_runs(monkeypatch):
    from evorl_pop.tasks import envs, make_task
    from evorl_pop.tasks.control import JaxEnvFamily

    class NoEvaluate:
        name, num_dims, maximize = "half/x", 2, True

        def init_solution(self, key):
            return jnp.zeros(self.num_dims)

        def init_state(self):
            return ()

        def update_state(self, task_state, info):
            return task_state

    class Half(JaxEnvFamily):
        description, pattern = "a family whose tasks cannot be scored", "half/<x>"

        def names(self):
            return ("half/x",)

        def make_task(self, name, **kwargs):
            return NoEvaluate()

    monkeypatch.setattr(registry.ENV_FAMILIES, "_entries", dict(registry.ENV_FAMILIES._entries))
    monkeypatch.setattr(envs, "_OWNERS", {})
    registry.register_env_family("half", Half())
    with pytest.raises(registry.PluginError) as err:
        make_task("half/x")
    assert str(err.value).startswith(
        "Half.make_task('half/x'): the NoEvaluate built lacks evaluate (core.interfaces.Task "
    )


def test_a_pbt_member_lacking_a_part_is_refused_before_it_runs(monkeypatch):
    from evorl_pop.algorithms import pbt

    @dataclasses.dataclass(frozen=True)
    class Settings:
        learning_rate: float = 0.01

        def validate(self): ...

    class NoActing:  # a member PBT cannot show (render)
        def __init__(self, settings, config):
            self.env = None

        def init(self, key): ...
        def train(self, learner, own, values, key): ...
        def evaluate(self, learner, own, key, episodes): ...

    monkeypatch.setattr(registry.LEARNERS, "_entries", dict(registry.LEARNERS._entries))
    part = registry.MemberPart(Settings(), NoActing, ("learning_rate",))
    registry.register_learner("mine", registry.LearnerSpec(member=part))
    with pytest.raises(registry.PluginError) as err:
        pbt.PBT(pbt.Config(task="CartPole-v1", learner="mine", population_size=2))
    assert str(err.value) == (
        "learner 'mine' (member.member): the NoActing built lacks acting "
        "(algorithms.pbt_members.Member declares env, init, train, evaluate, acting)"
    )
