"""Many seeds in one compiled program (``--seeds N``): each seed is its single run."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from _env import cli_env

from evorl_pop import cli
from evorl_pop.run import plotting, restore, store

RUN = ["--chunk", "2", "-q", "--no-figure", "--devices", "1"]

#: (algorithm, its settings): tiny runs of every kind of state the seed axis carries.
CASES = {
    "openes": ("es", {"strategy": "Open_ES", "task": "CartPole-v1", "population_size": 8,
                      "hidden_sizes": [4], "episode_length": 30}),
    "cmaes": ("es", {"strategy": "CMA_ES", "task": "sphere", "population_size": 8, "num_dims": 3}),
    "cemrl": ("cemrl", {"task": "Pendulum-v1", "population_size": 4, "num_elites": 2,
                        "num_rl_actors": 2, "episode_length": 20,
                        "learning_starts": 10, "buffer_capacity": 128, "eval_episodes": 1,
                        "td3": {"actor_hidden_sizes": [8], "critic_hidden_sizes": [8],
                                "batch_size": 16}}),
    "ppo": ("ppo", {"task": "CartPole-v1", "num_envs": 2, "unroll_length": 8,
                    "num_minibatches": 2, "num_epochs": 1, "policy_hidden_sizes": [8],
                    "value_hidden_sizes": [8]}),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    # In-process commands with --devices edit XLA_FLAGS; undo it afterwards.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _config(tmp_path, case: str) -> str:
    algorithm, settings = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump({"algorithm": algorithm, "algorithm_config": settings}))
    return str(path)


def _train(config, out, *extra) -> dict:
    assert cli.main(["train", "--config", config, *RUN, "--out", str(out), *extra]) == 0
    return store.read_metrics(out)


def _without_clock(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "wall_time"}


def _assert_seed_is_its_run(many: dict, seed: int, one: dict) -> None:
    rows = many["seed"] == seed
    assert set(many) - {"seed"} == set(one)
    for column, values in _without_clock(one).items():
        # a batched program may round differently from a single run's (losses near 0)
        np.testing.assert_allclose(many[column][rows], values, rtol=2e-5, atol=1e-6, err_msg=column)


def _seeds_tier(case: str):
    """CMA-ES in the default tier; PPO's in the exhaustive one (a learner's seed axis:
    CEM-RL's TD3 in the long tier has one too); the others in the long tier."""
    if case == "cmaes":
        return ()
    return pytest.mark.exhaustive if case == "ppo" else pytest.mark.slow


@pytest.mark.parametrize("case", [pytest.param(c, marks=_seeds_tier(c)) for c in CASES])
def test_each_seed_of_a_4_seed_run_is_its_single_run_on_1_and_2_devices(case, tmp_path):
    config = _config(tmp_path, case)
    many = {
        n: _train(config, tmp_path / f"many{n}", "-g", "4", "--seed", "5", "--seeds", "4",
                  "--devices", str(n))  # the last --devices counts
        for n in (1, 2)
    }  # fmt: skip
    for n in (1, 2):
        assert many[n]["seed"].tolist() == [5, 6, 7, 8] * 4
        assert many[n]["generation"].tolist() == [g for g in (1, 2, 3, 4) for _ in range(4)]
    for seed in (5, 8):  # the first and the last
        one = _train(
            config, tmp_path / f"one{seed}", "-g", "4", "--seed", str(seed), "--devices", "1"
        )
        _assert_seed_is_its_run(many[1], seed, one)
        _assert_seed_is_its_run(many[2], seed, one)
    # the seeds are different runs
    firsts = many[1]["fitness_mean"][many[1]["generation"] == 1]
    assert len(set(firsts.tolist())) > 1


def test_a_multi_seed_run_resumes_to_its_uninterrupted_result_and_draws_each_seed(tmp_path):
    config = _config(tmp_path, "openes")
    split, whole = tmp_path / "split", tmp_path / "whole"
    _train(config, split, "-g", "2", "--seeds", "3")
    assert cli.main(["resume", str(split), "--more", "2", *RUN]) == 0
    _train(config, whole, "-g", "4", "--seeds", "3")
    resumed, uninterrupted = (_without_clock(store.read_metrics(p)) for p in (split, whole))
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)
    # each seed's own environment steps, counted on across the resume
    for seed in (0, 1, 2):
        rows = resumed["seed"] == seed
        np.testing.assert_array_equal(
            resumed["env_steps"][rows], np.cumsum(resumed["env_steps_gen"][rows])
        )
    # the figure's runs are the seeds, one group: a mean with a band
    runs = plotting.load_runs(split)
    assert [c["seed"] for c, _ in runs] == [0, 1, 2]
    assert all(m["generation"].tolist() == [1, 2, 3, 4] for _, m in runs)
    assert plotting.plot_runs([split], out=tmp_path / "seeds.png")[0].stat().st_size > 0


def test_the_summary_line_is_the_mean_and_standard_error_over_seeds(tmp_path, capsys):
    config = _config(tmp_path, "cmaes")
    run = tmp_path / "run"
    capsys.readouterr()
    cli.main(["train", "--config", config, "--chunk", "2", "--no-figure", "-g", "2",
              "--seeds", "3", "--out", str(run)])  # fmt: skip
    done = capsys.readouterr().err.strip().splitlines()[-1]
    metrics = store.read_metrics(run)
    last = metrics["fitness_mean"][metrics["generation"] == 2]
    error = last.std(ddof=1) / np.sqrt(3)
    assert f"fitness_mean at generation 2: {last.mean():.6g} ± {error:.3g}" in done, done
    assert "(mean ± standard error over 3 of 3 seeds)" in done
    assert (run / "train.log").read_text().splitlines()[-1].endswith(done.split(", ", 3)[-1][:-6])


def test_seeds_below_1_is_one_line(tmp_path, capsys):
    status = cli.main(["train", "--seeds", "0", "-q", "--out", str(tmp_path / "r")])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "evorl-pop train: config error: seeds must be >= 1, got 0."
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_killed_multi_seed_run_resumes_to_the_uninterrupted_result(tmp_path):
    config = _config(tmp_path, "cmaes")
    run, whole = tmp_path / "run", tmp_path / "whole"
    args = ["train", "--config", config, "--seeds", "4", "--chunk", "1", "--checkpoint-every",
            "1", "-q", "--no-figure", "--devices", "1"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "evorl_pop.cli", *args, "-g", "100000", "--out", str(run)],
        env=cli_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not (run / store.CHECKPOINT_FILENAME).exists() or (
            restore.load_checkpoint(run).generation < 3
        ):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    at = restore.load_checkpoint(run).generation
    assert cli.main(["resume", str(run), "--generations", str(at + 2), *RUN, "--chunk", "1"]) == 0
    # the same chunks (a scan's length may change how XLA rounds)
    _train(config, whole, "--seeds", "4", "-g", str(at + 2), "--chunk", "1")
    resumed, uninterrupted = (_without_clock(store.read_metrics(p)) for p in (run, whole))
    for column, values in uninterrupted.items():
        np.testing.assert_array_equal(resumed[column], values, err_msg=column)


def test_seeds_that_do_not_fit_say_how_many_do_before_anything_runs(tmp_path, capsys):
    args = ["train", "--seeds", "1000", "--pop", "100000", "--task", "sphere", "--set",
            "num_dims=1000", "--devices", "1", "-q", "--out", str(tmp_path / "r")]  # fmt: skip
    assert cli.main(args) != 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("evorl-pop train: error: seeds=1000 of population_size=100,000 "), line
    fit = int(line.split("about ")[2].split(" replicas fit")[0])
    assert 1 <= fit < 1000, line
    assert not (tmp_path / "r").exists()


# --- sweeps: settings of a grid beside the seeds -------------------------------------------

SWEEP_RUN = ["--strategy", "Open_ES", "--pop", "16", "-g", "4", "--chunk", "2", "-q",
             "--no-figure", "--devices", "1"]  # fmt: skip


@pytest.mark.slow  # a shape-changing sweep's programs stay in the default tier
def test_a_sweeps_settings_share_one_program_and_each_is_its_single_run(tmp_path, monkeypatch):
    from evorl_pop.run import loop

    programs = []
    chunk_fn = loop.chunk_fn
    monkeypatch.setattr(loop, "chunk_fn", lambda a, n: programs.append(a) or chunk_fn(a, n))
    sweep = ["--sweep", "learning_rate=0.01,0.1", "--sweep", "sigma_init=0.05,0.2"]
    args = [*SWEEP_RUN, "--seeds", "2", *sweep, "--out", str(tmp_path / "sweep")]
    assert cli.main(["train", *args]) == 0
    assert len(programs) == 1  # 4 settings x 2 seeds, one program
    many = store.read_metrics(tmp_path / "sweep")
    assert list(many)[3:6] == ["seed", "learning_rate", "sigma_init"]
    for lr, sigma, seed in ((0.1, 0.2, 1), (0.01, 0.05, 0)):
        one = tmp_path / f"one{lr}"
        settings = ["--set", f"learning_rate={lr}", "--set", f"sigma_init={sigma}"]
        assert (
            cli.main(["train", *SWEEP_RUN, *settings, "--seed", str(seed), "--out", str(one)]) == 0
        )
        rows = (
            (many["seed"] == seed) & (many["learning_rate"] == lr) & (many["sigma_init"] == sigma)
        )
        single = store.read_metrics(one)
        for column, values in _without_clock(single).items():
            np.testing.assert_allclose(many[column][rows], values, rtol=2e-5, err_msg=column)
    # the summary: one row per setting, the final mean fitness over its 2 seeds
    table = (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()
    assert table[0] == "learning_rate,sigma_init,seeds,fitness_mean,fitness_mean_se"
    assert len(table) == 5
    lr, sigma, seeds, mean, _ = table[1].split(",")
    last = (many["generation"] == 4) & (many["learning_rate"] == float(lr))
    last &= many["sigma_init"] == float(sigma)
    assert int(seeds) == 2 and float(mean) == pytest.approx(many["fitness_mean"][last].mean())
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 0


def test_a_shape_changing_key_compiles_once_per_value(tmp_path, monkeypatch):
    from evorl_pop.run import loop

    programs = []
    chunk_fn = loop.chunk_fn
    monkeypatch.setattr(loop, "chunk_fn", lambda a, n: programs.append(a) or chunk_fn(a, n))
    sweep = ["--sweep", "population_size=8,16", "--sweep", "learning_rate=0.01,0.1"]
    out = tmp_path / "sweep"
    assert cli.main(["train", *SWEEP_RUN, *sweep, "--out", str(out)]) == 0
    assert len(programs) == 2  # one per population size, each with both learning rates
    for size in (8, 16):
        rows = store.read_metrics(out / f"population_size={size}")
        assert rows["learning_rate"].tolist() == [0.01, 0.1] * 4
        assert set(rows["episodes"].tolist()) == {size}  # one episode per candidate
    table = (out / "sweep.csv").read_text().splitlines()
    assert table[0] == "population_size,learning_rate,seeds,fitness_mean,fitness_mean_se"
    assert [line.split(",")[:2] for line in table[1:]] == [
        ["8", "0.01"], ["8", "0.1"], ["16", "0.01"], ["16", "0.1"]
    ]  # fmt: skip


def test_a_sweep_that_is_not_key_values_or_not_data_in_one_program_is_one_line(tmp_path, capsys):
    bad = cli.main(["train", *SWEEP_RUN, "--sweep", "learning_rate", "--out", str(tmp_path / "a")])
    assert bad == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "evorl-pop train: config error: sweep: 'learning_rate' is not KEY=V1,V2,... "
        "(e.g. --sweep learning_rate=0.01,0.03)."
    )
    from evorl_pop.algorithms.es import ESConfig
    from evorl_pop.base import ConfigError
    from evorl_pop.run import shell
    from evorl_pop.run.config import RunConfig

    config = RunConfig("es", algorithm_config=ESConfig(population_size=8), devices=1,
                       sweep=("population_size=8,16",))  # fmt: skip
    with pytest.raises(ConfigError, match="sweep: population_size cannot enter one program"):
        shell.train(config, tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()


def test_swept_values_read_as_set_reads_them_and_every_setting_is_checked_first(tmp_path, capsys):
    from evorl_pop.run import replicas

    grid = replicas.parse_sweep(["learning_rate=1e-2,3e-2", "hidden_sizes=[4],[8, 8]", "n=null"])
    assert grid == {"learning_rate": [0.01, 0.03], "hidden_sizes": [[4], [8, 8]], "n": [None]}
    assert replicas.parse_sweep(replicas.format_sweep(grid)) == grid
    refused = {
        "learning_rate=0.1,abc": "sweep: learning_rate: expected a number or null, got 'abc'",
        "population_size=8,abc": "sweep: population_size: expected an integer, got 'abc'",
        "learning_rate=0.1,,0.2": "sweep: learning_rate has an empty value in '0.1,,0.2'",
        "nokey=1,2": "sweep: 'nokey' is not a field of the algorithm's config. Did you mean",
        "seed=1,2": "sweep: seed is a run setting",
        "sigma_init=0.1,-1": "sweep: sigma_init=-1: sigma_init must be > 0",
    }
    for sweep, message in refused.items():
        out = tmp_path / "never"
        assert cli.main(["train", *SWEEP_RUN, "--sweep", sweep, "--out", str(out)]) == 2, sweep
        assert message in capsys.readouterr().err, sweep
        assert not out.exists()
        # --print-config checks what train checks
        assert cli.main(["train", "--sweep", sweep, "--print-config"]) == 2, sweep
        assert message in capsys.readouterr().err
    # a program's algorithm refuses a value: before the first program runs
    odd = ["--pop", "6", "--devices", "2", "--sweep", "population_size=6,7"]
    assert cli.main(["train", *SWEEP_RUN[:-2], *odd, "--out", str(tmp_path / "odd")]) == 2
    assert "cannot take population_size=7" in capsys.readouterr().err
    assert not (tmp_path / "odd").exists()


def test_a_sweep_of_what_pbt_searches_itself_is_refused(capsys):
    for learner, key in (("td3", "td3.actor_lr"), ("td3", "exploration_noise"),
                         ("ppo", "ppo.learning_rate")):  # fmt: skip
        args = ["train", "-a", "pbt", "--set", f"learner={learner}", "--print-config"]
        assert cli.main([*args, "--sweep", f"{key}=0.001,0.01"]) == 2
        assert f"sweep: pbt sets {key} itself (it searches it)" in capsys.readouterr().err
    kept = ["train", "-a", "pbt", "--sweep", "td3.batch_size=32,64", "--print-config"]
    assert cli.main(kept) == 0


def test_a_one_setting_sweep_and_a_sweep_of_widths_run_and_summarize(tmp_path, capsys):
    one = tmp_path / "one"
    assert cli.main(["train", *SWEEP_RUN, "--sweep", "sigma_init=0.1", "--out", str(one)]) == 0
    assert store.read_metrics(one)["sigma_init"].tolist() == [0.1] * 4
    widths = tmp_path / "widths"
    assert cli.main(["train", *SWEEP_RUN, "--sweep", "hidden_sizes=[4],[8, 8]", "--out",
                     str(widths)]) == 0  # fmt: skip
    table = (widths / "sweep.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in table] == ["hidden_sizes", "[4]", '"[8']
    assert (widths / "sweep.png").stat().st_size > 0
    assert capsys.readouterr().out == ""  # -q: nothing but errors


def test_a_sweep_of_several_programs_resumes_from_its_top_folder(tmp_path):
    sweep = ["--sweep", "population_size=8,16", "--sweep", "sigma_init=0.05,0.2"]
    run = [*SWEEP_RUN[:2], "-t", "CartPole-v1", "--set", "episode_length=20", *SWEEP_RUN[4:]]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert cli.main(["train", *run, *sweep, "-g", "3", "--out", str(whole)]) == 0
    plan = (whole / "sweep.yaml").read_text()
    assert cli.main(["train", *run, *sweep, "-g", "5", "--out", str(whole)]) == 1  # refused
    assert (whole / "sweep.yaml").read_text() == plan
    assert cli.main(["train", *run, *sweep, "-g", "2", "--out", str(part)]) == 0
    import shutil

    shutil.rmtree(part / "population_size=16")  # a program the interrupted sweep never began
    (part / "sweep.csv").unlink()
    assert cli.main(["resume", str(part), "--more", "1", "-q", "--no-figure"]) == 0
    for program in ("population_size=8", "population_size=16"):
        resumed, uninterrupted = (
            store.read_metrics(part / program),
            store.read_metrics(whole / program),
        )
        for column, values in _without_clock(uninterrupted).items():
            np.testing.assert_array_equal(resumed[column], values, err_msg=f"{program} {column}")
    assert (part / "sweep.csv").read_text() == (whole / "sweep.csv").read_text()
    # one program resumed alone: the sweep's summary follows it
    assert cli.main(["resume", str(part / "population_size=8"), "--more", "1", "-q",
                     "--no-figure"]) == 0  # fmt: skip
    assert (part / "sweep.csv").read_text() != (whole / "sweep.csv").read_text()


def test_a_stopped_program_of_a_sweep_says_to_finish_the_sweep(tmp_path):
    program = tmp_path / "sizes" / "population_size=8"
    program.mkdir(parents=True)
    (program / store.CHECKPOINT_FILENAME).write_bytes(b"")
    assert store.resume_hint(program).endswith(f"resume {program}`.")
    (tmp_path / "sizes" / store.SWEEP_PLAN).write_text("algorithm: es\n")
    assert (
        store.resume_hint(program) == f"finish the sweep with `evorl-pop resume {program.parent}`."
    )


def test_erls_ga_settings_enter_one_program_as_data():
    from evorl_pop.algorithms.erl import ERL
    from evorl_pop.algorithms.erl import Config as ERLConfig
    from evorl_pop.core.engine import make_mesh
    from evorl_pop.run import replicas

    config = ERLConfig(population_size=4, episode_length=20)
    grid = {"mutation_std": [0.05, 0.2], "crossover_prob": [0.0, 0.5], "population_size": [4, 6]}
    assert replicas.program_keys(ERL, config, make_mesh(1), grid) == ["population_size"]


def test_each_seed_exports_its_own_archive_as_its_single_run(tmp_path):
    args = ["train", "-a", "mapelites", "--task", "qd/arm", "--pop", "16", "-g", "3",
            "--chunk", "3", "--devices", "1", "-q", "--no-figure"]  # fmt: skip
    assert cli.main([*args, "--seeds", "2", "--out", str(tmp_path / "many")]) == 0
    assert cli.main([*args, "--seed", "1", "--out", str(tmp_path / "one")]) == 0
    together = np.load(tmp_path / "many" / "seed=1" / "archive.npz")
    alone = np.load(tmp_path / "one" / "archive.npz")
    assert set(together.files) == set(alone.files)
    for name in alone.files:
        np.testing.assert_allclose(together[name], alone[name], rtol=1e-5, err_msg=name)
    assert (tmp_path / "many" / "seed=0" / "archive.npz").exists()
