"""Loggers beside ``metrics.csv``: TensorBoard and Weights & Biases, as recorders.

A run config names them (``loggers: [csv, tensorboard, wandb]``; ``csv`` is
always on, since ``resume`` and ``plot`` read ``metrics.csv``), the command
line adds them (``--log tensorboard --log wandb``), and from Python they are
:class:`~evorl_pop.run.recorders.Recorder` objects passed to a run::

    shell.train(config, recorders=[TensorBoard(), WandB(project="sweep")])

Both log exactly the rows of ``metrics.csv``; a resumed run continues the
same TensorBoard run and the same W&B run, without a duplicate or a missing
generation. Under ``jax.distributed`` only process 0 logs.

- :class:`TensorBoard` writes event files to ``RUN/tb/`` (tensorboardX): every
  column as a scalar against the generation (tag ``<column>``) and against the
  environment steps (tag ``env_steps/<column>``, once there are any), the config as hyperparameters
  and as text, ``fitness.png`` as an image at the end. On resume, the events
  past the checkpoint (written before a kill) are dropped from the files.
- :class:`WandB` logs through W&B's own client: the config, one history step
  per generation (``step`` = generation), the figure. Offline (files under
  ``RUN/wandb/``, ``wandb sync`` uploads them) unless you are logged in;
  ``WANDB_MODE`` decides when set. The run id is kept in ``RUN/wandb-id``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import netrc
import os
import queue
import secrets
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from evorl_pop.base import ConfigError, did_you_mean, write_atomic
from evorl_pop.run import config as config_lib
from evorl_pop.run.config import RunConfig
from evorl_pop.run.recorders import Recorder, Run, logger

TB_DIRNAME = "tb"
WANDB_ID_FILENAME = "wandb-id"
ENV_STEPS_PREFIX = "env_steps/"  # tags of the scalars against environment steps

# (module to import, extra that installs it) per logger
_NEEDS = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}


def require(name: str) -> None:
    """ConfigError, in one line naming the install command, when a logger's package is missing."""
    module, extra = _NEEDS[name]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"The {name} logger needs the package {module!r}, which is not installed: "
            f"pip install 'evorl-pop[{extra}]' (pip install -e '.[{extra}]' in a checkout)."
        )


def _flat_config(config_text: str) -> dict[str, Any]:
    """The run config as flat ``key: scalar`` pairs (lists and null as text)."""
    import yaml

    def flat(data, prefix=""):
        for key, value in data.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            elif isinstance(value, bool | int | float | str):
                yield f"{prefix}{key}", value
            else:
                yield f"{prefix}{key}", str(value)

    return dict(flat(yaml.safe_load(config_text) or {}))


# --- TensorBoard ----------------------------------------------------------------------------


def _records(data: bytes):
    """The records of a TFRecord file (length, CRC, payload, CRC), each whole, verbatim."""
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            return  # a record cut short by a kill
        yield data[pos:end], data[pos + 12 : pos + 12 + length]
        pos = end


def truncate_events(tb_dir: Path, generation: int, env_steps: int) -> int:
    """Drops, from the event files in ``tb_dir``, the scalars and images past ``generation``
    (tags ``env_steps/...``: past ``env_steps``), so that a resumed run writes each once;
    returns the last generation whose scalars the files still hold (0: none)."""
    from tensorboardX.proto import event_pb2

    last = 0
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        kept = []
        dropped = False
        for raw, payload in _records(data):
            event = event_pb2.Event.FromString(payload)
            if event.HasField("summary") and event.summary.value:
                tag = event.summary.value[0].tag
                limit = env_steps if tag.startswith(ENV_STEPS_PREFIX) else generation
                if event.step > limit:
                    dropped = True
                    continue
                if any(v.tag == "generation" for v in event.summary.value):
                    last = max(last, event.step)
            kept.append(raw)
        if dropped or sum(map(len, kept)) != len(data):
            write_atomic(path, b"".join(kept))
    return last


def replica_tagged(row: dict[str, Any], labels=()) -> dict[str, Any]:
    """A row's values by tag: a replica's (its ``labels`` columns: seed, swept values) as
    ``<column>/<label>=<value>,...``, one series per replica, the shared ``generation``
    and ``wall_time`` as they are."""
    if not labels:
        return row
    name = ",".join(f"{k}={row[k]}" for k in labels)
    shared = ("generation", "wall_time")
    return {k if k in shared else f"{k}/{name}": v for k, v in row.items() if k not in labels}


class TensorBoard(Recorder):
    """Event files in ``RUN/tb/`` (or ``log_dir``): every ``metrics.csv`` column against the
    generation and (tags ``env_steps/<column>``) the environment steps, the config as
    hyperparameters, the fitness figure as an image. ``tensorboard --logdir runs`` shows them.

    The writer's thread writes the events to disk every ``flush_secs`` and at the end; a
    resumed run first writes the rows up to its checkpoint that a killed process left unwritten.

    Args:
      log_dir: where the event files go (default: ``RUN/tb``).
      flush_secs: seconds between the writer's flushes to disk.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, flush_secs: int = 30):
        require("tensorboard")
        self.log_dir = log_dir
        self.flush_secs = flush_secs
        self.writer = None

    def start(self, run: Run, state) -> None:
        if not run.writer:
            return
        from tensorboardX import SummaryWriter

        self.labels = list(run.labels[0]) if run.labels else []
        log_dir = Path(self.log_dir) if self.log_dir is not None else run.run_dir / TB_DIRNAME
        logged = 0
        if run.start_generation > 0 and log_dir.is_dir():
            logged = truncate_events(log_dir, run.generation, run.env_steps)
        self.generation = run.generation
        self.writer = SummaryWriter(str(log_dir), flush_secs=self.flush_secs)
        if run.start_generation == 0:
            from tensorboardX.summary import hparams

            self.writer.add_text("config", "```yaml\n" + run.config_text + "```", 0)
            for summary in hparams(_flat_config(run.config_text), {"fitness_best": math.nan}):
                self.writer.file_writer.add_summary(summary)
        # the rows up to the checkpoint the files lack (a killed process's last unwritten ones)
        for row in parse_rows(run.columns, run.lines):
            if row["generation"] > logged:
                self.row(row)

    def row(self, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        from tensorboardX.proto.summary_pb2 import Summary

        generation, steps = int(row["generation"]), int(row["env_steps"])
        tagged = replica_tagged(row, self.labels)
        values = [(name, float(value)) for name, value in tagged.items()]
        # one event per row and axis, all columns in it: a scalar each for TensorBoard
        add = self.writer.file_writer.add_summary
        add(Summary(value=[Summary.Value(tag=n, simple_value=v) for n, v in values]), generation)
        if steps > 0:  # none before the first step (black-box tasks take none)
            prefix = ENV_STEPS_PREFIX
            add(
                Summary(value=[Summary.Value(tag=prefix + n, simple_value=v) for n, v in values]),
                steps,
            )
        self.generation = generation

    def image(self, name: str, path: Path) -> None:
        if self.writer is None:
            return
        import matplotlib.image

        pixels = matplotlib.image.imread(path)  # floats in [0, 1], (height, width, channels)
        self.writer.add_image(name, pixels, self.generation, dataformats="HWC")

    def finish(self, run: Run, completed: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# --- Weights & Biases -----------------------------------------------------------------------


def logged_in() -> bool:
    """Whether a W&B API key is at hand (``WANDB_API_KEY`` or ``~/.netrc``), without network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1]
        return netrc.netrc().authenticators(host.rstrip("/")) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandB(Recorder):
    """A W&B run through W&B's own client: the config, one history step per generation
    (``step`` is the generation; ``env_steps`` and every other column as values), the
    fitness figure at the end.

    Offline (``RUN/wandb/offline-run-*``; ``wandb sync`` uploads them) unless a W&B API
    key is at hand; ``WANDB_MODE`` decides when set. A resumed run continues the W&B run
    whose id ``RUN/wandb-id`` holds: it logs first the rows up to the checkpoint that the
    W&B run lacks (those a killed process had not passed on), then each new one.

    Args:
      project: the W&B project (default: the config's ``wandb_project``, else
        ``$WANDB_PROJECT``, else ``evorl-pop``).
      entity: the W&B entity (default: the config's ``wandb_entity``, else
        ``$WANDB_ENTITY``, else the account's default).
      mode: ``online``, ``offline`` or ``disabled`` (default: as above).
      **init: further keywords for ``wandb.init`` (tags, group, notes, ...).
    """

    def __init__(
        self, project: str | None = None, entity: str | None = None, mode: str | None = None, **init
    ):
        require("wandb")
        self.project = project
        self.entity = entity
        self.mode = mode
        self.init = init
        self.run = None

    def _mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return os.environ.get("WANDB_MODE") or ("online" if logged_in() else "offline")

    def start(self, run: Run, state) -> None:
        if not run.writer:
            return
        import wandb

        config: RunConfig = run.config
        id_path = run.run_dir / WANDB_ID_FILENAME
        if id_path.exists():
            run_id = id_path.read_text().strip()
        else:
            run_id = secrets.token_hex(4)  # W&B ids: lowercase letters and digits
            write_atomic(id_path, f"{run_id}\n".encode())
        self.generation = run.generation
        project = self.project or config.wandb_project or os.environ.get("WANDB_PROJECT")
        self.run = wandb.init(
            project=project or "evorl-pop",
            entity=self.entity or config.wandb_entity or os.environ.get("WANDB_ENTITY"),
            id=run_id,
            resume="allow",
            dir=str(run.run_dir),
            mode=self._mode(),
            name=run.run_dir.name,
            config=config_lib.to_dict(config),
            settings=wandb.Settings(silent=True, console="off"),
            **{"reinit": "create_new", **self.init},
        )
        # What the W&B run holds already: its own step counter (online), the files of earlier
        # sessions (offline; a killed process may have lost its last rows, or all).
        self.logged = max(self.run.starting_step - 1, last_offline_step(run.run_dir, run_id))
        # W&B's client takes milliseconds a row: a thread of its own passes them on
        self.labels = list(run.labels[0]) if run.labels else []
        self.queue = queue.Queue()
        self.pending = {}  # a multi-seed run's rows of generations not yet logged
        self.errors = []
        self.thread = threading.Thread(target=self._pass_on, daemon=True, name="wandb-log")
        self.thread.start()
        for row in parse_rows(run.columns, run.lines):  # rows up to the checkpoint it lacks
            self.row(row)
        self.flush(run, state)

    def _pass_on(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self.run.log(item[0], step=item[1])
            except Exception as err:  # the run goes on; train.log and stderr say what was lost
                self.errors.append(f"generation {item[1]}: {err}")

    def row(self, row: dict[str, Any]) -> None:
        if self.run is None:
            return
        generation = int(row["generation"])
        self.generation = generation
        if generation <= self.logged:
            return  # this W&B run has the row already (identical: a resume repeats it)
        values = {k: _number(v) for k, v in replica_tagged(row, self.labels).items()}
        if not self.labels:
            self.queue.put((values, generation))
            self.logged = generation
        else:  # a multi-seed run: a generation's seeds in one step, at the chunk's end
            self.pending.setdefault(generation, {}).update(values)

    def flush(self, run: Run, state) -> None:
        for generation, values in sorted(self.pending.items()):
            self.queue.put((values, generation))
            self.logged = generation
        self.pending = {}

    def image(self, name: str, path: Path) -> None:
        if self.run is None:
            return
        import wandb

        self.queue.put(({name: wandb.Image(str(path))}, max(self.generation, self.logged)))

    def finish(self, run: Run, completed: bool) -> None:
        if self.run is not None:
            self.queue.put(None)
            self.thread.join()
            if self.errors:
                text = f"W&B did not take {len(self.errors)} row(s): {self.errors[0]}"
                logger.warning("warning: %s", text)
                print(f"warning: {text}", file=sys.stderr)
            self.run.finish(exit_code=0 if completed else 1)
            self.run = None
            import wandb

            # W&B's service writes its files when it ends: a resume in this process reads them
            wandb.teardown()


def _number(value) -> int | float:
    """A metrics value as a plain Python number (``nan`` stays a float)."""
    import numpy as np

    if isinstance(value, bool | int | np.bool_ | np.integer):
        return int(value)
    return float(value)


#: The logger classes by their name in a run config.
LOGGER_CLASSES = {"tensorboard": TensorBoard, "wandb": WandB}


def from_config(config: RunConfig, given=()) -> list[Recorder]:
    """The recorders ``config.loggers`` names, but those of a class ``given`` holds already.

    Raises:
      ConfigError: an unknown logger, or one whose package is not installed.
    """
    out = []
    for name in dict.fromkeys(config.loggers):
        if name == "csv":
            continue
        if name not in LOGGER_CLASSES:
            hint = did_you_mean(name, config_lib.LOGGERS)
            raise ConfigError(
                f"loggers: unknown logger {name!r}.{hint} Valid: {', '.join(config_lib.LOGGERS)}."
            )
        cls = LOGGER_CLASSES[name]
        if not any(isinstance(r, cls) for r in given):
            out.append(cls())
    return out


def parse_rows(columns, lines) -> list[dict]:
    """``metrics.csv`` lines as rows of Python numbers (as :meth:`Recorder.row` gets them)."""
    out = []
    for line in lines:
        values = line.rstrip("\n").split(",")
        pairs = [(c, v) for c, v in zip(columns, values, strict=True) if v]
        out.append({c: int(v) if v.lstrip("-").isdigit() else float(v) for c, v in pairs})
    return out


def last_offline_step(run_dir: Path, run_id: str) -> int:
    """The last history step of the offline W&B files of run ``run_id`` in ``run_dir`` (0: none)."""
    files = (run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    steps = [h.get("_step", 0) for path in files for h in read_wandb_history(path)]
    return max(steps, default=0)


def read_wandb_history(path: str | os.PathLike) -> list[dict]:
    """The history steps of an offline W&B run file (``run-<id>.wandb``), in order."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    out = []
    buf = b""
    block = 32768  # LevelDB log blocks
    pos = 7  # after a 7-byte W&B header
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block  # a block's padding
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind not in (1, 4):
            continue
        try:
            record = pb.Record.FromString(buf)
        except DecodeError:  # the end of a file cut short
            break
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
        buf = b""
    return out
