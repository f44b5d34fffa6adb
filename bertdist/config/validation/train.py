"""`bertdist train`'s rules: every impossible combination in a configuration, found before anything starts.

`validate` lists every problem at once, each naming its field. With `check_files` it also checks that the
named input files exist (the vocabulary, a pretrained model); `bertdist submit` turns that off, because the
submitting machine may not see the cluster's files. The rules other commands share (a URL where only a local
path works, heads that divide the hidden size) are functions here that they call too.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from bertdist import storage
from bertdist.config.batch_warmup import batch_schedule, phases_in_ramp
from bertdist.config.choices import choice_problems, choices
from bertdist.config.errors import ConfigError
from bertdist.config.model import ARCHITECTURES
from bertdist.config.objectives import OBJECTIVES
from bertdist.config.schema import CheckpointConfig, Config, LaunchConfig, MaskingConfig, OptimConfig, TrainConfig
from bertdist.config.validation.distill import distill_problems
from bertdist.config.validation.health import health_problems
from bertdist.config.validation.mixture import mixture_problems
from bertdist.config.validation.model import architecture_problems, compile_problems, pretrained_arch_problem
from bertdist.config.validation.optim import optim_problems
from bertdist.credentials import credentials_problem
from bertdist.errors import UserError
from bertdist.model import registry

PRECISIONS = choices(TrainConfig, "precision")
BACKENDS = choices(LaunchConfig, "backend")
VERIFY_MODES = choices(CheckpointConfig, "verify")
"""How a checkpoint's files are checked before loading (bertdist.train.integrity)."""

MLFLOW_STORE_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
"""The URL schemes MLflow keeps runs in; another (`foo://`, `s3://`) was accepted and the run trained untracked."""


def tracking_store_problem(uri: str) -> str:
    """Why `uri` is no MLflow tracking store (a URL of another scheme: `s3://`, `foo://`), or ''."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme and scheme not in MLFLOW_STORE_SCHEMES:
        return f"{scheme}:// is not an MLflow tracking store ({', '.join(MLFLOW_STORE_SCHEMES)}, or a directory)"
    return ""


LOCAL_ONLY_FIELDS = (
    "data.vocab_file",
    "checkpoint.init_from_pretrained",
    "finetune.output_dir",
    "finetune.train_file",
    "finetune.dev_file",
    "finetune.vocab_file",
)
"""Path fields that do not take an object-store URL yet (the others do: bertdist.storage)."""


def local_only_problems(cfg: Config) -> list[str]:
    """A URL in a field that takes only a local path: refused by name, never written as a local `s3:` directory."""
    found = []
    for dotted in LOCAL_ONLY_FIELDS:
        section, name = dotted.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and storage.is_url(value):
            found.append(
                f"{dotted}: {value} is a URL; this field takes a local path (a URL here is not supported yet: "
                "copy it to local disk)"
            )
    return found


DEEPSPEED_OWNED_KEYS = {
    "train_batch_size": "train.global_batch_size (or data.phases.N.global_batch_size)",
    "train_micro_batch_size_per_gpu": "data.phases.N.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size / (micro batch x world size)",
    "optimizer": "optim.*",
    "scheduler": "optim.lr / optim.warmup_steps",
    "amp": "train.precision",
    "bfloat16": "train.precision (DeepSpeed's other name for the bf16 section)",
}
"""Keys of `train.deepspeed` that the schema owns outright: set there, they would silently disagree with it."""


def deepspeed_passthrough_problems(cfg: Config) -> list[str]:
    """`train.deepspeed` keys that take a schema field's place or contradict it, each naming both.

    The passthrough is merged over the config that validation checked; a contradiction would run a
    combination that validation refuses (LAMB under ZeRO 2, say) without a word. A key that repeats the
    schema's own value is harmless and accepted."""
    t, extra = cfg.train, cfg.train.deepspeed
    found = [
        f"train.deepspeed.{key}: set by our config ({owner}); remove it from train.deepspeed"
        for key, owner in DEEPSPEED_OWNED_KEYS.items()
        if key in extra
    ]
    zero = extra.get("zero_optimization")
    if isinstance(zero, dict) and "stage" in zero and zero["stage"] != t.zero_stage:
        found.append(
            f"train.deepspeed.zero_optimization.stage: {zero['stage']!r} contradicts train.zero_stage={t.zero_stage}; "
            "set train.zero_stage instead"
        )
    for section in ("fp16", "bf16"):
        value = extra.get(section)
        if isinstance(value, dict) and "enabled" in value and bool(value["enabled"]) != (t.precision == section):
            found.append(
                f"train.deepspeed.{section}.enabled: {value['enabled']!r} contradicts train.precision={t.precision}; "
                "set train.precision instead"
            )
    if "gradient_clipping" in extra and extra["gradient_clipping"] != cfg.optim.grad_clip_norm:
        found.append(
            f"train.deepspeed.gradient_clipping: {extra['gradient_clipping']!r} contradicts optim.grad_clip_norm="
            f"{cfg.optim.grad_clip_norm}; set optim.grad_clip_norm instead"
        )
    return found


def credential_problems(values: Any, where: str = "") -> list[str]:
    """Every string field (at any depth) that holds a URL with credentials in it, redacted (bertdist.credentials)."""
    if isinstance(values, dict):
        return [p for key, value in values.items() for p in credential_problems(value, f"{where}.{key}".lstrip("."))]
    if isinstance(values, (list, tuple)):
        return [p for i, value in enumerate(values) for p in credential_problems(value, f"{where}.{i}")]
    problem = credentials_problem(values, where) if isinstance(values, str) else ""
    return [problem] if problem else []


def batch_warmup_problems(cfg: Config, world: int) -> list[str]:
    """A batch warmup (bertdist.config.batch_warmup) whose sizes every phase it reaches can train on `world` ranks:
    a start below the phase's full batch and a multiple of its micro batch x world size (then so is every size of
    the ramp). Judged from step 0, whatever step a run resumes at."""
    t, found = cfg.train, []
    if t.batch_warmup_tokens < 0 or t.batch_warmup_start < 0:
        return [
            f"train.batch_warmup_tokens, train.batch_warmup_start: must be >= 0 (0: no batch warmup), got "
            f"{t.batch_warmup_tokens}, {t.batch_warmup_start}"
        ]
    if not t.batch_warmup_tokens:
        return (
            [
                "train.batch_warmup_start: applies only with train.batch_warmup_tokens (the tokens the ramp takes); "
                "set both, or neither"
            ]
            if t.batch_warmup_start
            else []
        )
    if not t.batch_warmup_start:
        return [
            "train.batch_warmup_start: the ramp's first global batch (sequences) is needed with "
            "train.batch_warmup_tokens"
        ]
    phases = cfg.data.phases
    if world <= 0 or any(min(ph.max_seq_length, ph.micro_batch_size, cfg.global_batch_size(ph)) <= 0 for ph in phases):
        return found  # reported on their own fields; the ramp cannot be laid out
    for i in phases_in_ramp(cfg):
        full, micro = cfg.global_batch_size(phases[i]), phases[i].micro_batch_size
        if t.batch_warmup_start >= full:
            found.append(
                f"train.batch_warmup_start: {t.batch_warmup_start} is not below the global batch of "
                f"data.phases.{i} ({full}), which the ramp reaches; the ramp rises to it"
            )
        elif t.batch_warmup_start % (micro * world):
            found.append(
                f"train.batch_warmup_start: {t.batch_warmup_start} (the ramp's sizes are its multiples) is "
                f"not divisible by data.phases.{i}.micro_batch_size x world size = {micro} x {world}"
            )
    schedule = batch_schedule(cfg)
    last = schedule[-1] if schedule else None
    if last is not None and last.global_batch_size < cfg.global_batch_size(phases[last.phase]):
        run_tokens = sum(s.steps * s.global_batch_size * phases[s.phase].max_seq_length for s in schedule)
        found.append(
            f"train.batch_warmup_tokens: {t.batch_warmup_tokens:,} is more than the {run_tokens:,} tokens the run "
            f"trains (at full length), so its batch never reaches data.phases.{last.phase}'s global batch "
            f"({cfg.global_batch_size(phases[last.phase]):,}; the last steps train {last.global_batch_size:,}); "
            "shorten the ramp or lengthen the run"
        )
    return found


MAX_LOADER_WORKERS = 256
"""Loader processes per rank: more was accepted (100,000 forked until the machine killed the run, unsaid)."""


def validate(cfg: Config, world_size: int | None = None, check_files: bool = True) -> None:
    """Raise ConfigError with every impossible combination in `cfg`.

    `world_size` defaults to the launch section's nodes x gpus_per_node; the trainer passes the real one.
    """
    p: list[str] = []
    m, t, o, d = cfg.model, cfg.train, cfg.optim, cfg.data
    world = world_size if world_size is not None else cfg.launch.world_size()

    p.extend(choice_problems(cfg))
    for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        if getattr(m, name) <= 0:
            p.append(f"model.{name}: must be positive, got {getattr(m, name)}")
    for name in ("intermediate_size", "initializer_range"):  # 0: 4 x hidden_size; 0: weights start at zero
        if not getattr(m, name) >= 0:
            p.append(f"model.{name}: must be >= 0, got {getattr(m, name)}")
    if m.type_vocab_size < 1:
        p.append(f"model.type_vocab_size: must be at least 1 (the segment embedding's rows), got {m.type_vocab_size}")
    if not (m.layer_norm_eps > 0 and math.isfinite(m.layer_norm_eps)):
        p.append(f"model.layer_norm_eps: must be a positive number, got {m.layer_norm_eps}")
    if m.mlm_logits_mib < 0:
        p.append(f"model.mlm_logits_mib: must be >= 0 (0: the whole logits always), got {m.mlm_logits_mib}")
    p.extend(architecture_problems(m, d.phases))
    p.extend(distill_problems(cfg, check_files))
    for name in ("hidden_dropout_prob", "attention_dropout_prob"):
        if not 0.0 <= getattr(m, name) < 1.0:
            p.append(f"model.{name}: must be in [0, 1), got {getattr(m, name)}")

    if t.zero_stage not in (0, 1, 2, 3):
        p.append(f"train.zero_stage: must be 0, 1, 2 or 3, got {t.zero_stage}")
    p.extend(compile_problems(m, t.zero_stage))
    if t.global_batch_size <= 0:
        p.append(f"train.global_batch_size: must be positive, got {t.global_batch_size}")
    for name in ("log_every_steps", "eval_every_steps", "eval_batches", "max_nonfinite_steps"):
        if getattr(t, name) <= 0:
            p.append(f"train.{name}: must be positive, got {getattr(t, name)}")
    for name in ("rendezvous_timeout_s", "collective_timeout_s"):
        if not getattr(t, name) > 0:
            p.append(f"train.{name}: must be positive, got {getattr(t, name)}")
    p.extend(health_problems(cfg))
    if world <= 0:
        p.append(f"launch.nodes x launch.gpus_per_node: world size must be positive, got {world}")

    if not d.phases:
        p.append("data.phases: at least one phase is needed")
    for i, ph in enumerate(d.phases):
        name = f"data.phases.{i}"
        if not ph.train_dir and not ph.mixture:
            p.append(f"{name}.train_dir: empty")
        if ph.steps <= 0:
            p.append(f"{name}.steps: must be positive, got {ph.steps}")
        batch, batch_field = (
            (ph.global_batch_size, f"{name}.global_batch_size")
            if ph.global_batch_size
            else (t.global_batch_size, "train.global_batch_size")
        )
        if ph.global_batch_size < 0:
            p.append(f"{name}.global_batch_size: must be >= 0 (0: train.global_batch_size), got {ph.global_batch_size}")
        elif ph.micro_batch_size <= 0:
            p.append(f"{name}.micro_batch_size: must be positive, got {ph.micro_batch_size}")
        elif world > 0 and batch > 0 and batch % (ph.micro_batch_size * world):
            p.append(
                f"{batch_field}: {batch} is not divisible by "
                f"{name}.micro_batch_size x world size = {ph.micro_batch_size} x {world}"
            )
        if not ph.lr >= 0:
            p.append(f"{name}.lr: must be >= 0 (0: the run's schedule), got {ph.lr}")
        if not 0 <= ph.warmup_steps <= max(ph.steps, 0):
            p.append(f"{name}.warmup_steps: must be in [0, {name}.steps = {ph.steps}], got {ph.warmup_steps}")
        if ph.max_seq_length < 8:
            p.append(f"{name}.max_seq_length: must be at least 8, got {ph.max_seq_length}")
        if ph.max_seq_length > m.max_position_embeddings:
            p.append(
                f"{name}.max_seq_length: {ph.max_seq_length} exceeds "
                f"model.max_position_embeddings={m.max_position_embeddings}"
            )
    p.extend(mixture_problems(cfg))
    mk = d.masking
    if not 0.0 < mk.masked_lm_prob < 1.0:
        p.append(f"data.masking.masked_lm_prob: must be in (0, 1), got {mk.masked_lm_prob}")
    if not 0.0 < mk.span_length_p <= 1.0:
        p.append(f"data.masking.span_length_p: must be in (0, 1], got {mk.span_length_p}")
    if mk.max_span_words < 1:
        p.append(f"data.masking.max_span_words: must be at least 1, got {mk.max_span_words}")
    for name in ("span_length_p", "max_span_words"):
        if not mk.span_masking and getattr(mk, name) != getattr(MaskingConfig(), name):
            p.append(f"data.masking.{name}: applies only with data.masking.span_masking: true, which is off")
    if OBJECTIVES.get(m.objective, OBJECTIVES["mlm"]).span_boundaries and not mk.span_masking:
        p.append(
            f"data.masking.span_masking: model.objective {m.objective} predicts masked spans from their boundaries; "
            "set it to true (and use shards prepared with --masking dynamic)"
        )
    if mk.max_predictions_per_seq < 0:
        p.append(
            f"data.masking.max_predictions_per_seq: must be >= 0 (0: from the rate), got {mk.max_predictions_per_seq}"
        )
    if not (
        mk.mask_token_fraction >= 0
        and mk.random_token_fraction >= 0
        and mk.mask_token_fraction + mk.random_token_fraction <= 1
    ):
        p.append(
            f"data.masking: mask_token_fraction and random_token_fraction must be >= 0 with a sum <= 1, got "
            f"{mk.mask_token_fraction} and {mk.random_token_fraction}"
        )
    for i, ph in enumerate(d.phases):
        own = cfg.masking(ph)
        if ph.masked_lm_prob and not 0.0 < ph.masked_lm_prob < 1.0:
            p.append(f"data.phases.{i}.masked_lm_prob: must be in (0, 1) (0: data.masking's), got {ph.masked_lm_prob}")
        cap = d.masking.max_predictions_per_seq
        if ph.masked_lm_prob and cap and math.ceil(ph.masked_lm_prob * ph.max_seq_length) > cap:
            p.append(
                f"data.phases.{i}.masked_lm_prob: {ph.masked_lm_prob} of {ph.max_seq_length} tokens is up to "
                f"{math.ceil(ph.masked_lm_prob * ph.max_seq_length)} predictions a sample, above "
                f"data.masking.max_predictions_per_seq={cap}, which would cut the rate; raise it, or set it to 0 "
                "(from each phase's rate)"
            )
        if (ph.mask_token_fraction >= 0 or ph.random_token_fraction >= 0) and not (
            own.mask_token_fraction + own.random_token_fraction <= 1
        ):
            p.append(
                f"data.phases.{i}: mask_token_fraction and random_token_fraction must sum to <= 1, got "
                f"{own.mask_token_fraction} and {own.random_token_fraction}"
            )
    if not 0 <= d.loader_workers <= MAX_LOADER_WORKERS:
        p.append(f"data.loader_workers: must be in [0, {MAX_LOADER_WORKERS}], got {d.loader_workers}")
    if t.seed < 0:
        p.append(f"train.seed: must be >= 0, got {t.seed}")
    inputs = [s for ph in d.phases for s in (ph.train_dir, ph.eval_dir) if s and storage.inside(t.output_dir, s)]
    if inputs:
        p.append(
            f"train.output_dir: {t.output_dir} is inside the shards {inputs[0]}; the run's checkpoints and logs "
            "would mix with them: write it beside them"
        )

    own_schedules = [i for i, ph in enumerate(d.phases) if ph.lr]
    if own_schedules and len(own_schedules) != len(d.phases):
        p.append(
            f"data.phases.N.lr: set for phases {own_schedules} only; either every phase has its own schedule or none"
        )
    # A schedule setting that does not apply is refused rather than dropped (the plan would show another warmup).
    for i, ph in enumerate(d.phases):
        if ph.warmup_steps and not ph.lr:
            p.append(
                f"data.phases.{i}.warmup_steps: applies only to a phase's own schedule (data.phases.{i}.lr); this "
                "run follows optim.lr and optim.warmup_steps"
            )
    if (
        own_schedules
        and len(own_schedules) == len(d.phases)
        and o.warmup_steps
        # the default's 100 may stand beside phases with warmups of their own; another value would be dropped
        and (not any(ph.warmup_steps for ph in d.phases) or o.warmup_steps != OptimConfig().warmup_steps)
    ):
        p.append(
            f"optim.warmup_steps: {o.warmup_steps} does not apply once every phase sets its own lr; set "
            "data.phases.N.warmup_steps for each phase (or optim.warmup_steps: 0 for no warmup)"
        )
    if own_schedules and len(own_schedules) == len(d.phases) and o.lr != OptimConfig().lr:
        p.append(f"optim.lr: {o.lr} does not apply once every phase sets its own lr (data.phases.N.lr)")
    if all(ph.global_batch_size for ph in d.phases) and t.global_batch_size != TrainConfig().global_batch_size:
        p.append(
            f"train.global_batch_size: {t.global_batch_size} does not apply once every phase sets its own "
            "(data.phases.N.global_batch_size)"
        )
    p.extend(optim_problems(cfg))
    p.extend(batch_warmup_problems(cfg, world))

    p.extend(deepspeed_passthrough_problems(cfg))
    p.extend(credential_problems(cfg.to_dict()))
    if cfg.checkpoint.every_steps <= 0:
        p.append(f"checkpoint.every_steps: must be positive, got {cfg.checkpoint.every_steps}")
    if not cfg.checkpoint.lease_timeout_s >= 4:
        p.append(
            "checkpoint.lease_timeout_s: must be at least 4 (a heartbeat every quarter of it), "
            f"got {cfg.checkpoint.lease_timeout_s}"
        )
    if cfg.checkpoint.keep_last < 1:
        p.append(f"checkpoint.keep_last: must be at least 1, got {cfg.checkpoint.keep_last}")

    p.extend(local_only_problems(cfg))
    st = cfg.storage
    for name, low in (("cache_mb", 1), ("prefetch_samples", 0), ("fetch_threads", 1)):
        if getattr(st, name) < low:
            p.append(f"storage.{name}: must be at least {low}, got {getattr(st, name)}")
    if storage.is_url(t.output_dir):
        p.append(
            f"train.output_dir: {t.output_dir} is a URL; the run directory (logs, local checkpoint copies) is local: "
            "keep it on disk and set checkpoint.uri to the store"
        )

    if not t.forecast_hours >= 0:
        p.append(f"train.forecast_hours: must be >= 0 (0: no forecast), got {t.forecast_hours}")
    problem = tracking_store_problem(cfg.tracking.tracking_uri)
    if cfg.tracking.enabled and problem:
        p.append(f"tracking.tracking_uri: {problem}; the run would train untracked")
    lc = cfg.launch
    if not 1 <= lc.master_port <= 65535:
        p.append(f"launch.master_port: {lc.master_port} is not a TCP port")
    if not 0 <= lc.min_nodes <= max(lc.nodes, 1):
        p.append(
            f"launch.min_nodes: must be between 1 and launch.nodes={lc.nodes} (0: launch.nodes), got {lc.min_nodes}"
        )
    for name in ("max_restarts", "restart_backoff_s", "readmit_after_s"):
        if getattr(lc, name) < 0:
            p.append(f"launch.{name}: must be >= 0, got {getattr(lc, name)}")
    for name in ("host_probe_interval_s", "stop_timeout_s"):
        if not getattr(lc, name) > 0:
            p.append(f"launch.{name}: must be positive, got {getattr(lc, name)}")

    ds = cfg.eval.downstream
    if ds.config and (ds.every_checkpoints <= 0 or not ds.timeout_s > 0 or not re.fullmatch(r"[\w.-]+", ds.name)):
        p.append(
            f"eval.downstream: every_checkpoints and timeout_s must be positive and name a word (letters, digits, "
            f"_ . -), got {ds.every_checkpoints}, {ds.timeout_s}, {ds.name!r}"
        )
    if check_files and not storage.is_url(d.vocab_file):
        if not d.vocab_file:
            p.append("data.vocab_file: empty (make one with `bertdist vocab`)")
        elif not Path(d.vocab_file).exists():
            p.append(f"data.vocab_file: {d.vocab_file} does not exist (make one with `bertdist vocab`)")
        else:
            from bertdist.data.tokenizer import count_tokens, vocab_mismatch

            try:
                n = count_tokens(d.vocab_file)
            except UserError as e:
                p.append(f"data.vocab_file: {e}")
                n = 0
            if n > m.vocab_size:
                p.append(
                    f"model.vocab_size: {m.vocab_size} is smaller than the {n} tokens of data.vocab_file={d.vocab_file}"
                )
            if n and m.arch in ARCHITECTURES:
                p += registry.spec(m.arch).vocab_problems(m, d.vocab_file)
            if n and cfg.checkpoint.init_from_pretrained:
                try:
                    problem = vocab_mismatch(d.vocab_file, m.vocab_size, cfg.checkpoint.init_from_pretrained)
                except UserError as e:  # the pretrained model's tokenizer files, unreadable
                    problem = str(e)
                if problem:
                    p.append(f"data.vocab_file: {problem} (checkpoint.init_from_pretrained)")
        if Path(t.output_dir).exists() and not Path(t.output_dir).is_dir():
            p.append(f"train.output_dir: {t.output_dir} is a file, not a directory")
        pretrained = cfg.checkpoint.init_from_pretrained
        if pretrained and not Path(pretrained).is_dir():
            p.append(f"checkpoint.init_from_pretrained: {pretrained} is not a directory")
        elif pretrained and m.arch in ARCHITECTURES and (problem := pretrained_arch_problem(pretrained, m.arch)):
            p.append(problem)
    if p:
        raise ConfigError(p)
