"""Every algorithm ``evorl-pop list`` shows on one task of every environment family: it
trains 2 generations, renders, resumes a third generation that matches the uninterrupted
run, or it is refused before anything is built, in one line that says why.

The pairs come from the registries (an algorithm or a family joins by registering; a
family names its quick task in ``example``), each algorithm shrunk by the settings of
:data:`SMALL` it has. The run's outcome for each pair is printed at the end of the
session ("algorithm x family matrix").
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import yaml

from evorl_pop import cli, registry
from evorl_pop.run import config as config_lib
from evorl_pop.run import store

#: Black-box functions: the family of tasks that are not environments.
BLACK_BOX = "sphere"
#: Each family's quick task, and the black-box one.
TASKS = {
    **{name: family.example or family.names()[0] for name, family in registry.ENV_FAMILIES.items()},
    "black-box": BLACK_BOX,
    # the DM Control suite in MuJoCo's C simulator: Gymnasium's family, through shimmy
    "dm_control": "gym:dm_control/cartpole-balance-v0",
}
ALGORITHMS = [spec.name for spec in config_lib.specs()]
#: The project's own pairs that must be refused: the learners and the hybrids take no
#: black-box functions.
LEARNING = ("a2c", "cemrl", "ddpg", "dqn", "erl", "impala", "pbt", "ppo", "sac")
#: ... nor multi-agent tasks (a learner learns one agent's policy; ES evolves a team).
REFUSED = {(a, f) for a in LEARNING for f in ("black-box", "marl")}
#: DQN takes one unmasked discrete action; every family's quick task has continuous
#: actions, or masked ones (Jumanji's).
REFUSED |= {("dqn", f) for f in TASKS}
#: EnvPool's pools have no learner lanes (single resets with keys of their own).
REFUSED |= {(a, "envpool") for a in LEARNING}
#: The only columns render draws nothing for, and what it says of their task: a function
#: is no environment. Every other column's cell, whatever the algorithm, draws its policy.
NOTHING_TO_RENDER = {"black-box": "a black-box function, not an environment"}
#: MAP-Elites needs a task with behaviour descriptors (qd/arm, ...), which no family has.
REFUSED |= {("mapelites", f) for f in TASKS}
#: Jumanji's quick task has discrete actions: the algorithms of continuous actions refuse it.
CONTINUOUS = {(a, "jumanji") for a in ("cemrl", "ddpg", "erl", "pbt", "sac")}
REFUSED |= CONTINUOUS

#: A config field of this name, wherever an algorithm (or its learner's settings) has
#: one, takes this value: a few tiny generations of tiny networks.
SMALL = {
    "population_size": 4,
    "hidden_sizes": [8],
    "actor_hidden_sizes": [8],
    "critic_hidden_sizes": [8],
    "policy_hidden_sizes": [8],
    "value_hidden_sizes": [8],
    "episode_length": 10,
    "eval_episodes": 1,
    "noise": "normal",
    "num_dims": 4,
    "learning_starts": 10,
    "buffer_capacity": 64,
    "batch_size": 16,
    "num_envs": 2,
    "unroll_length": 10,
    "num_minibatches": 2,
    "num_epochs": 1,
    "num_elites": 2,
    "num_rl_actors": 2,
    "tournament_size": 2,
    "updates_per_actor": 2,
    "updates_per_generation": 2,
    "interval": 20,
}
RUN = ["--chunk", "1", "--devices", "1", "-q", "--no-figure"]


def _small(config) -> dict:
    """The fields of :data:`SMALL` a config (dataclass) has, its settings' too."""
    small = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in SMALL:
            small[field.name] = SMALL[field.name]
        elif dataclasses.is_dataclass(value):
            if nested := _small(value):
                small[field.name] = nested
    return small


def _config_file(tmp_path, algorithm: str, task: str):
    settings = _small(config_lib.get(algorithm).config_class())
    path = tmp_path / "config.yaml"
    data = {"algorithm": algorithm, "seed": 1, "algorithm_config": {**settings, "task": task}}
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _rows(run) -> dict:
    """metrics.csv without its clock columns."""
    metrics = store.read_metrics(run)
    return {k: v for k, v in metrics.items() if "time" not in k}


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


#: The columns whose every row compiles a physics simulator for a minute on a CPU
#: (Playground's MJX, brax's) and Gymnasium's own (its code is the DM Control column's,
#: Gymnasium's tasks through shimmy) in the exhaustive tier; the others in the long tier.
EXHAUSTIVE = ("playground", "brax", "gym")
#: DM Control cells whose code the long tier runs elsewhere on a Gymnasium task
#: (tests/test_host_learners.py: PBT, ERL and SAC on the host, resumed and on 1 and 2
#: devices) or through a sibling (NSGA-II's cell for NSGA-III's, MOEA/D's and RVEA's), in
#: the exhaustive tier.
EXHAUSTIVE_CELLS = {
    ("pbt", "dm_control"),
    ("erl", "dm_control"),
    ("sac", "dm_control"),
    ("nsga3", "dm_control"),
    ("moead", "dm_control"),
    ("rvea", "dm_control"),
    # IMPALA steps Gymnasium's lanes as A2C does (the same PPO-based host path)
    ("impala", "dm_control"),
}
#: The multi-objective methods evaluate a family's task through ES's evaluator, which
#: the ES cell runs: on the newer families, NSGA-II's cell stands for its siblings only
#: in the exhaustive tier too. A2C and IMPALA act through PPO's masked heads on Jumanji.
EXHAUSTIVE_CELLS |= {
    (a, f) for a in ("nsga2", "nsga3", "moead", "rvea") for f in ("marl", "envpool", "jumanji")
}
EXHAUSTIVE_CELLS |= {("a2c", "jumanji"), ("impala", "jumanji")}
CELLS = [
    pytest.param(
        a,
        f,
        id=f"{a}-{f}",
        marks=pytest.mark.exhaustive
        if f in EXHAUSTIVE or (a, f) in EXHAUSTIVE_CELLS
        else pytest.mark.slow,
    )
    for a in ALGORITHMS
    for f in TASKS
]


@pytest.mark.parametrize(("algorithm", "family"), CELLS)
def test_every_algorithm_on_every_family(algorithm, family, tmp_path, capsys, record_property):
    task = TASKS[family]
    config = _config_file(tmp_path, algorithm, task)
    run, whole = tmp_path / "run", tmp_path / "whole"
    capsys.readouterr()
    status = cli.main(["train", "--config", config, "-g", "2", *RUN, "--out", str(run)])
    err = capsys.readouterr().err
    own = config_lib.get(algorithm).module in registry.BUILTIN["algorithm"]
    if (algorithm, family) in REFUSED or (status == 2 and not own):
        # refused as a config error: one line, no traceback, no run folder
        assert status == 2, err[-2000:]
        lines = err.strip().splitlines()
        why = "needs continuous actions" if (algorithm, family) in CONTINUOUS else "error: task:"
        assert len(lines) == 1 and "config error:" in lines[0] and why in lines[0], err
        assert not run.exists()
        record_property("matrix", f"{algorithm} x {family} ({task}): refused: {lines[0]}")
        return
    assert status == 0, err[-3000:]

    assert cli.main(["render", str(run)]) == 0
    drawn = capsys.readouterr().out
    first = drawn.splitlines()[0]
    if family in NOTHING_TO_RENDER:
        assert first == f"nothing to render: {task!r} is {NOTHING_TO_RENDER[family]}.", drawn
    else:  # every algorithm's best policy on an environment is drawn
        assert first.startswith("wrote "), drawn
        assert os.path.getsize(first.split()[1]) > 0, drawn

    assert cli.main(["resume", str(run), "--more", "1", "-q", "--no-figure"]) == 0
    assert cli.main(["train", "--config", config, "-g", "3", *RUN, "--out", str(whole)]) == 0
    resumed, uninterrupted = _rows(run), _rows(whole)
    assert list(resumed) == list(uninterrupted)
    assert len(resumed["generation"]) == 3
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    shown = f"wrote {os.path.basename(first.split()[1])}" if first.startswith("wrote") else first
    record_property("matrix", f"{algorithm} x {family} ({task}): trained, {shown}, resumed")


#: The task each algorithm's many-seed run trains on: its own kind of task, else the
#: gymnax family's quick one.
SEEDS_TASKS = {
    "dqn": "CartPole-v1",
    "mapelites": "qd/arm",
    "nsga2": "mo/zdt1",
    "nsga3": "mo/dtlz2",
    "moead": "mo/zdt1",
    "rvea": "mo/dtlz2",
}


#: Many-seed programs a sibling's covers, in the exhaustive tier: ERL's is CEM-RL's with
#: another hybrid step, MOEA/D's and RVEA's NSGA-II's with another selection, IMPALA's
#: A2C's with another loss.
SEEDS_BY_SIBLING = ("erl", "moead", "rvea", "impala")


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(a, marks=pytest.mark.exhaustive if a in SEEDS_BY_SIBLING else pytest.mark.slow)
        for a in ALGORITHMS
    ],
)
def test_every_algorithm_runs_many_seeds_in_one_program(algorithm, tmp_path, record_property):
    task = SEEDS_TASKS.get(algorithm, TASKS["gymnax"])
    config = _config_file(tmp_path, algorithm, task)
    many, one = tmp_path / "many", tmp_path / "one"
    args = ["train", "--config", config, "-g", "2", *RUN]
    assert cli.main([*args, "--seeds", "2", "--out", str(many)]) == 0
    assert cli.main([*args, "--seed", "2", "--out", str(one)]) == 0
    rows, single = store.read_metrics(many), _rows(one)
    assert rows["seed"].tolist() == [1, 2, 1, 2]  # the config's seed is 1
    for column, values in single.items():
        # a batched program may round differently from a single run's
        np.testing.assert_allclose(
            rows[column][rows["seed"] == 2], values, rtol=2e-5, atol=1e-6, err_msg=column
        )
    record_property("matrix", f"{algorithm} x 2 seeds in one program ({task}): as its own runs")
