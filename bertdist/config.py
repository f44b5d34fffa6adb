"""The single typed schema of a bertdist run, and how it is layered and checked.

Defaults live in the dataclasses below; a YAML file overrides them; `key.sub=value` arguments on the
command line override the file. Every section is its own dataclass so that each component receives only
the part it needs (`build_model(cfg.model)`), and derived quantities (gradient accumulation, total steps)
are functions rather than fields that could disagree.

This module does not touch the filesystem beyond reading the YAML file and, in `validate`, checking that
named input files exist; it starts nothing.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertdist.errors import UserError

# L / H / A of BERT's published family (Turc et al. 2019 for the small ones; Devlin et al. 2018).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_attention_heads=2),
    "mini": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
    "small": dict(num_layers=4, hidden_size=512, num_attention_heads=8),
    "medium": dict(num_layers=8, hidden_size=512, num_attention_heads=8),
    "base": dict(num_layers=12, hidden_size=768, num_attention_heads=12),
    "large": dict(num_layers=24, hidden_size=1024, num_attention_heads=16),
}


class ConfigError(UserError, ValueError):
    """Raised with every problem found in a configuration, one per line, each naming its field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass
class ModelConfig:
    """BERT architecture. `size` picks a named preset; any other key given alongside it wins."""

    size: str = "base"
    """Named size: tiny, mini, small, medium, base or large (sets layers, hidden size, heads)."""
    num_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 0
    """Feed-forward width; 0 means 4 x hidden_size as in BERT."""
    vocab_size: int = 30522
    """Rows of the word embedding; must be at least the number of tokens in data.vocab_file."""
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    activation_checkpointing: bool = False
    """Recompute each encoder layer in the backward pass: less memory, about a third more compute."""

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> "ModelConfig":
        if size not in MODEL_SIZES:
            raise ConfigError([f"model.size: unknown size {size!r}; choose one of {', '.join(MODEL_SIZES)}"])
        return cls(size=size, **{**MODEL_SIZES[size], **overrides})

    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size


@dataclass
class PhaseConfig:
    """One stretch of training on one set of shards; phases run in order and share one LR schedule."""

    train_dir: str = "runs/data/train"
    """Directory written by `bertdist prepare` (shards + manifest.json)."""
    eval_dir: str = ""
    """Held-out shards for periodic evaluation; empty disables evaluation in this phase."""
    max_seq_length: int = 128
    """Must equal the sequence length the shards were made with (checked against the manifest)."""
    micro_batch_size: int = 32
    """Sequences per rank per forward/backward pass."""
    steps: int = 1000
    """Optimizer steps spent in this phase."""


@dataclass
class DataConfig:
    vocab_file: str = "runs/vocab/vocab.txt"
    phases: list[PhaseConfig] = field(default_factory=lambda: [PhaseConfig()])
    loader_workers: int = 2
    """DataLoader worker processes per rank."""
    shuffle_buffer_size: int = 2000
    """Samples held for shuffling inside each worker (shards are also shuffled per epoch)."""


@dataclass
class OptimConfig:
    """Adam(W) with BERT's decoupled weight decay, linear warmup then linear decay to zero."""

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    """Not applied to LayerNorm weights and biases."""
    grad_clip_norm: float = 1.0
    """0 disables clipping."""
    warmup_steps: int = 100
    fused: str = "auto"
    """auto: DeepSpeed's FusedAdam on GPU, torch AdamW elsewhere; on/off force it."""


@dataclass
class TrainConfig:
    global_batch_size: int = 256
    """Sequences per optimizer step over all ranks (micro batch x ranks x accumulation)."""
    precision: str = "fp32"
    """fp32, fp16 (dynamic loss scaling) or bf16. fp16/bf16 are GPU paths."""
    zero_stage: int = 1
    seed: int = 1234
    output_dir: str = "runs/train"
    """Run directory: checkpoints, the local MLflow store, logs."""
    log_every_steps: int = 10
    eval_every_steps: int = 500
    eval_batches: int = 20
    max_nonfinite_steps: int = 20
    """Stop after this many consecutive steps with a non-finite loss."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """Extra DeepSpeed config keys merged over the generated ones (for experts)."""


@dataclass
class CheckpointConfig:
    every_steps: int = 1000
    keep_last: int = 3
    resume: str = "auto"
    """auto: continue from the latest complete checkpoint if any; none: start fresh; or a path."""
    init_from_pretrained: str = ""
    """A Hugging Face BERT directory to start from (continued pretraining)."""


@dataclass
class TrackingConfig:
    enabled: bool = True
    tracking_uri: str = ""
    """Empty: MLFLOW_TRACKING_URI if set, else a SQLite store in the run directory."""
    experiment_name: str = "bertdist"
    run_name: str = ""
    log_system_metrics: bool = True
    upload_checkpoints: bool = False
    """Upload checkpoint files as artifacts (multi-GB); by default only their paths are logged."""


@dataclass
class LaunchConfig:
    backend: str = "local"
    """local, deepspeed (hostfile over SSH), slurm or ray."""
    nodes: int = 1
    gpus_per_node: int = 1
    """Ranks per node (GPUs, or CPU processes on a machine without GPUs)."""
    hostfile: str = ""
    master_port: int = 29500
    time_limit: str = "24:00:00"
    partition: str = ""
    job_name: str = "bertdist"

    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)

    def total_steps(self) -> int:
        return sum(p.steps for p in self.data.phases)

    def gradient_accumulation_steps(self, phase: PhaseConfig, world_size: int) -> int:
        return self.train.global_batch_size // (phase.micro_batch_size * world_size)

    def phase_at(self, step: int) -> tuple[int, PhaseConfig]:
        """The phase (index, config) that optimizer step `step` (0-based) belongs to."""
        end = 0
        for i, phase in enumerate(self.data.phases):
            end += phase.steps
            if step < end:
                return i, phase
        return len(self.data.phases) - 1, self.data.phases[-1]

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


# ---------------------------------------------------------------------------------------------
# Loading: defaults < YAML < command-line overrides, with type checking of every leaf.


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a Config from defaults, an optional YAML file and `key.sub=value` overrides.

    Raises ConfigError listing every unknown key, wrong type and failed check at once.
    """
    raw: dict[str, Any] = {}
    problems: list[str] = []
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError([f"config file {path}: not found"]) from None
        except yaml.YAMLError as e:
            raise ConfigError([f"config file {path}: not valid YAML ({e})"]) from None
        if not isinstance(loaded, dict):
            raise ConfigError([f"config file {path}: top level must be a mapping of sections"])
        raw = loaded
    for item in overrides:
        try:
            _apply_override(raw, item)
        except ValueError as e:
            problems.append(str(e))
    cfg = _build(Config, raw, "", problems)
    if problems:
        # Fields with a wrong type kept their defaults; report the combinations that fail as well,
        # so one run of the command lists everything to fix.
        try:
            validate(cfg, check_files=False)
        except ConfigError as e:
            problems.extend(e.problems)
        raise ConfigError(problems)
    return cfg


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ValueError(f"override {item!r}: expected key.sub=value")
    value = yaml.safe_load(text) if text.strip() else ""
    parts = key.split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        nxt_is_index = parts[i + 1].isdigit()
        if isinstance(node, list):
            idx = int(part)
            while len(node) <= idx:
                node.append({})
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt_is_index else {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ValueError(f"override {item!r}: {'.'.join(parts[:-1])} is not a section")


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    """Instantiate dataclass `cls` from `raw`, recording unknown keys and type errors in `problems`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(raw).__name__}")
        raw = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            problems.append(f"{prefix}{key}: unknown key (known: {', '.join(sorted(names))})")
    values: dict[str, Any] = {}
    if cls is ModelConfig:
        size = raw.get("size", ModelConfig.size)
        if isinstance(size, str) and size in MODEL_SIZES:
            values.update(MODEL_SIZES[size])
        else:
            problems.append(f"{prefix}size: unknown size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    for f in dataclasses.fields(cls):
        if f.name in raw:
            value = _coerce(raw[f.name], hints[f.name], f"{prefix}{f.name}", problems)
            if value is not _INVALID:
                values[f.name] = value
    try:
        return cls(**values)
    except TypeError as e:  # only reachable through a bug in this module
        problems.append(f"{prefix.rstrip('.')}: {e}")
        return cls()


_INVALID = object()  # a leaf whose type was wrong: the field keeps its default and a problem is recorded


def _coerce(value: Any, hint: Any, name: str, problems: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, name + ".", problems)
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{name}: expected a list, got {type(value).__name__} {value!r}")
            return _INVALID
        return [_coerce(v, args[0], f"{name}.{i}", problems) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            problems.append(f"{name}: expected a list of {len(args)} numbers, got {value!r}")
            return _INVALID
        return tuple(_coerce(v, a, f"{name}.{i}", problems) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{name}: expected a mapping, got {type(value).__name__} {value!r}")
            return _INVALID
        return value
    if origin in (typing.Union, types.UnionType):
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as booleans; switches here are on/off
            return "on" if value else "off"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    problems.append(f"{name}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return _INVALID


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'l': [{'x': 2}]} -> {'a.b': 1, 'l.0.x': 2}; used for printing and tracking."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(flatten(x, f"{key}.{i}."))
        else:
            out[key] = v
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Validation of combinations: everything that would fail later, found before anything starts.

PRECISIONS = ("fp32", "fp16", "bf16")
BACKENDS = ("local", "deepspeed", "slurm", "ray")


def count_vocab_lines(path: str | os.PathLike) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.rstrip("\n"))


def validate(cfg: Config, world_size: int | None = None, check_files: bool = True) -> None:
    """Raise ConfigError with every impossible combination in `cfg`.

    `world_size` defaults to the launch section's nodes x gpus_per_node; the trainer passes the real one.
    """
    p: list[str] = []
    m, t, o, d = cfg.model, cfg.train, cfg.optim, cfg.data
    world = world_size if world_size is not None else cfg.launch.world_size()

    for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        if getattr(m, name) <= 0:
            p.append(f"model.{name}: must be positive, got {getattr(m, name)}")
    if m.num_attention_heads > 0 and m.hidden_size % m.num_attention_heads:
        p.append(f"model.hidden_size: {m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}")
    for name in ("hidden_dropout_prob", "attention_dropout_prob"):
        if not 0.0 <= getattr(m, name) < 1.0:
            p.append(f"model.{name}: must be in [0, 1), got {getattr(m, name)}")

    if t.precision not in PRECISIONS:
        p.append(f"train.precision: {t.precision!r} is not one of {', '.join(PRECISIONS)}")
    if t.zero_stage not in (0, 1, 2, 3):
        p.append(f"train.zero_stage: must be 0, 1, 2 or 3, got {t.zero_stage}")
    if t.global_batch_size <= 0:
        p.append(f"train.global_batch_size: must be positive, got {t.global_batch_size}")
    for name in ("log_every_steps", "eval_every_steps", "eval_batches", "max_nonfinite_steps"):
        if getattr(t, name) <= 0:
            p.append(f"train.{name}: must be positive, got {getattr(t, name)}")
    if world <= 0:
        p.append(f"launch.nodes x launch.gpus_per_node: world size must be positive, got {world}")

    if not d.phases:
        p.append("data.phases: at least one phase is needed")
    for i, ph in enumerate(d.phases):
        name = f"data.phases.{i}"
        if not ph.train_dir:
            p.append(f"{name}.train_dir: empty")
        if ph.steps <= 0:
            p.append(f"{name}.steps: must be positive, got {ph.steps}")
        if ph.micro_batch_size <= 0:
            p.append(f"{name}.micro_batch_size: must be positive, got {ph.micro_batch_size}")
        elif world > 0 and t.global_batch_size % (ph.micro_batch_size * world):
            p.append(
                f"train.global_batch_size: {t.global_batch_size} is not divisible by "
                f"{name}.micro_batch_size x world size = {ph.micro_batch_size} x {world}"
            )
        if ph.max_seq_length < 8:
            p.append(f"{name}.max_seq_length: must be at least 8, got {ph.max_seq_length}")
        if ph.max_seq_length > m.max_position_embeddings:
            p.append(
                f"{name}.max_seq_length: {ph.max_seq_length} exceeds model.max_position_embeddings={m.max_position_embeddings}"
            )
    if d.loader_workers < 0:
        p.append(f"data.loader_workers: must be >= 0, got {d.loader_workers}")

    total = cfg.total_steps()
    if o.warmup_steps < 0:
        p.append(f"optim.warmup_steps: must be >= 0, got {o.warmup_steps}")
    elif total > 0 and o.warmup_steps > total:
        p.append(f"optim.warmup_steps: {o.warmup_steps} is longer than the run (sum of data.phases.*.steps = {total})")
    if o.lr <= 0:
        p.append(f"optim.lr: must be positive, got {o.lr}")
    if len(o.betas) == 2 and not all(0.0 <= b < 1.0 for b in o.betas):
        p.append(f"optim.betas: each must be in [0, 1), got {list(o.betas)}")
    if o.fused not in ("auto", "on", "off"):
        p.append(f"optim.fused: {o.fused!r} is not one of auto, on, off")
    if o.grad_clip_norm < 0:
        p.append(f"optim.grad_clip_norm: must be >= 0, got {o.grad_clip_norm}")

    if cfg.checkpoint.every_steps <= 0:
        p.append(f"checkpoint.every_steps: must be positive, got {cfg.checkpoint.every_steps}")
    if cfg.checkpoint.keep_last < 1:
        p.append(f"checkpoint.keep_last: must be at least 1, got {cfg.checkpoint.keep_last}")

    lc = cfg.launch
    if lc.backend not in BACKENDS:
        p.append(f"launch.backend: {lc.backend!r} is not one of {', '.join(BACKENDS)}")
    if not 1 <= lc.master_port <= 65535:
        p.append(f"launch.master_port: {lc.master_port} is not a TCP port")

    if check_files:
        if not d.vocab_file:
            p.append("data.vocab_file: empty (make one with `bertdist vocab`)")
        elif not Path(d.vocab_file).is_file():
            p.append(f"data.vocab_file: {d.vocab_file} does not exist (make one with `bertdist vocab`)")
        else:
            n = count_vocab_lines(d.vocab_file)
            if n > m.vocab_size:
                p.append(f"model.vocab_size: {m.vocab_size} is smaller than the {n} tokens of data.vocab_file={d.vocab_file}")
        if cfg.checkpoint.init_from_pretrained and not Path(cfg.checkpoint.init_from_pretrained).is_dir():
            p.append(f"checkpoint.init_from_pretrained: {cfg.checkpoint.init_from_pretrained} is not a directory")
    if p:
        raise ConfigError(p)
