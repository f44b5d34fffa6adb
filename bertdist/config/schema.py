"""The single typed schema of a bertdist run: one dataclass per section, defaults and their meaning.

Every section is its own dataclass so that each component receives only the part it needs
(`build_model(cfg.model)`), and derived quantities (gradient accumulation, total steps) are
functions rather than fields that could disagree. Each field is documented where it is declared; those
docstrings are the reference for the YAML files in configs/. The model section (`ModelConfig`) and the fine-tuning
sections have modules of their own (`bertdist.config.model`, `bertdist.config.finetune`), which every stage
imports without the rest.

How files and overrides are layered onto these defaults is `bertdist.config.loading`; which combinations
are impossible is `bertdist.config.validation`. This module reads and starts nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from bertdist.config.finetune import DownstreamConfig, FinetuneConfig
from bertdist.config.model import ModelConfig


@dataclass
class PhaseConfig:
    """One stretch of training on one set of shards, or a mixture of several; phases run in order and share one LR
    schedule."""

    train_dir: str = "runs/data/train"
    """Directory written by `bertdist prepare` (shards + manifest.json); a phase with a `mixture` reads its sources
    instead (and may leave this empty)."""
    mixture: dict[str, float] = field(default_factory=dict)
    """Read several of data.sources instead of train_dir: source name -> weight (> 0), its micro batches' share
    being weight / the sum of the weights (bertdist.data.mixture); {}: train_dir alone."""
    mixture_temperature: float | None = None
    """Temperature sampling over the mixture's sources: a source's share is proportional to weight x tokens^τ (the
    tokens of one pass over its text: its manifest's sample tokens over its dupe factor; τ 1: by size, towards 0:
    uniform; XLM-R's 0.3). With every weight 1 that is
    plain temperature sampling. Unset: the weights alone. The share is of micro batches (sequences): with
    full-length samples (`--samples mlm`) it is the share of tokens too; with sentence pairs, whose lengths vary by
    language, a language's token share drifts from it (by a few points: hi 0.125 of the batches, 0.111 of the
    tokens in a review's 7-language mixture)."""
    eval_dir: str = ""
    """Held-out shards for periodic evaluation; empty disables evaluation in this phase."""
    max_seq_length: int = 128
    """Must equal the sequence length the shards were made with (checked against the manifest)."""
    micro_batch_size: int = 32
    """Sequences per rank per forward/backward pass."""
    steps: int = 1000
    """Optimizer steps spent in this phase."""
    global_batch_size: int = 0
    """Sequences per optimizer step in this phase; 0: train.global_batch_size. (NVIDIA's LAMB recipe for
    BERT-Large: 65,536 at length 128, then 32,768 at 512.)"""
    lr: float = 0.0
    """0: the phase follows the run's one schedule (optim.lr and optim.warmup_steps over all phases, the paper).
    Positive: the phase has its own, linear warmup over `warmup_steps` to `lr` then optim.schedule's decay over
    the phase's steps (linear: reaching 0 one step past its last; NVIDIA's recipe: poly). Either every phase
    sets it or none does."""
    warmup_steps: int = 0
    """Warmup of the phase's own schedule (with `lr`)."""
    decay_fraction: float = -1.0
    """With `lr` and `optim.schedule: wsd`, the share of the phase's steps its rate decays over (1: a decay phase,
    0: a stable one, as ModernBERT's pretraining, context-extension and decay phases); negative:
    optim.decay_fraction."""
    name: str = ""
    """Shown by `bertdist checkpoints` ("closes phase 1 (context-extension)"): pretrain, context-extension, decay..."""
    global_rope_theta: float = 0.0
    local_rope_theta: float = 0.0
    """ModernBERT: this phase's RoPE thetas (0: model.*_rope_theta), as a context-extension phase raises the
    global one."""
    masked_lm_prob: float = 0.0
    """This phase's masking rate (0: data.masking.masked_lm_prob), as mmBERT lowers it 30% -> 15% -> 5% by phase.
    Shards prepared with --masking dynamic only: static shards carry their masks, and refuse it."""
    mask_token_fraction: float = -1.0
    random_token_fraction: float = -1.0
    """This phase's 80/10/10 split: the shares of the predicted positions shown as [MASK] and as a random token
    (negative: data.masking's)."""


@dataclass(frozen=True)
class MaskingConfig:
    """BERT's masked-LM rules (`bertdist.data.masking`), one type for both places masks are made: the masks of
    `bertdist prepare --masking static`, written into the shards (from its flags: `InstanceOptions` is one of
    these), and the fresh mask per sample every epoch the loader chooses for shards prepared with `--masking
    dynamic` (from this section). Frozen: prepare's tasks and the loader's workers each hold a copy."""

    masked_lm_prob: float = 0.15
    """Share of a sample's tokens predicted (the paper: 0.15; Wettig et al. 2022 find 0.3-0.4 better for large
    models)."""
    max_predictions_per_seq: int = 0
    """At most this many predictions per sample; 0: as many as the rate gives (bertdist.data.masking.prediction_cap)."""
    whole_word_mask: bool = False
    """Mask all pieces of a word together (a `##` piece goes with the word before it)."""
    span_masking: bool = False
    """SpanBERT's masking: contiguous spans of whole words, each span's length in words drawn from a geometric
    distribution (`span_length_p`) cut at `max_span_words`, until the budget; one 80/10/10 choice per span."""
    span_length_p: float = 0.2
    """The geometric distribution's p (SpanBERT: 0.2, a mean span of 3.8 words with the cut at 10)."""
    max_span_words: int = 10
    mask_token_fraction: float = 0.8
    """Of the predicted positions, the share shown as [MASK] (the paper's 80/10/10)."""
    random_token_fraction: float = 0.1
    """The share shown as a random token; the rest show the original token."""


@dataclass
class DataConfig:
    vocab_file: str = "runs/vocab/vocab.txt"
    """The tokenizer, the one place it is named (`bertdist prepare --vocab` is the same): a WordPiece vocab.txt, a
    tokenizer.json of any Hugging Face `tokenizers` model (`bertdist vocab --model bpe`, an imported model's), or
    a directory holding either (its tokenizer.json first). Its special tokens [PAD] [UNK] [CLS] [SEP] [MASK] are
    looked up by name; shards record its sha256 and refuse another; model.vocab_size must hold all its tokens."""
    phases: list[PhaseConfig] = field(default_factory=lambda: [PhaseConfig()])
    loader_workers: int = 2
    """DataLoader worker processes per rank."""
    shuffle_buffer_size: int = 2000
    """Samples held for shuffling inside each worker (shards are also shuffled per epoch)."""
    packing: bool = False
    """Pack several samples into each row of a batch (block-diagonal attention, positions restarted per sample).
    A batch still holds `micro_batch_size` samples, and a step the recipe's number of sequences: packing only
    changes their layout (`bertdist.data.batching`). With `model.unpad` the encoder skips padding anyway, so
    packing mostly helps the padded encoder and fixed-shape (compiled) GPU runs."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    sources: dict[str, str] = field(default_factory=dict)
    """Named shard directories (local or in a store) that phases mix (data.phases.N.mixture), e.g. `{web:
    runs/data/web, wiki: s3://bucket/wiki}`; a name is a word (letters, digits, _ -): it names the source's
    metrics (data/tokens_NAME). All are made with data.vocab_file and one `--samples` kind."""
    source_exhausted: Literal["repeat", "stop"] = "repeat"
    """A mixture's source read to its end before its phase ends: repeat (its next epoch, reshuffled; logged as
    data/epochs_NAME) or stop (the run ends with one line naming the source, before training on a repeat)."""


@dataclass
class StorageConfig:
    """Object stores: any path field (a phase's train_dir and eval_dir, checkpoint.uri, finetune.init_from...) may
    be a URL such as s3://bucket/prefix (`bertdist.storage`). Credentials come from the environment or ~/.aws, never
    from here."""

    endpoint_url: str = ""
    """An S3-compatible store (MinIO, Ceph, R2, GCS's S3 interface); empty: AWS_ENDPOINT_URL_S3, else AWS."""
    cache_dir: str = ""
    """Where shard blocks read from a store are kept; empty: TMPDIR/bertdist-cache-UID/blocks/<hash of the URL>."""
    cache_mb: int = 4096
    """Bound of that cache, shared by the loader processes of a node that use the same directory."""
    prefetch_samples: int = 16384
    """How far ahead of its batches each loader process fetches blocks, in samples."""
    fetch_threads: int = 8
    """Concurrent ranged GETs per loader process."""


@dataclass
class OptimConfig:
    """Adam(W) with BERT's decoupled weight decay (or LAMB), linear warmup then linear decay to zero (or a
    warmup-stable-decay schedule)."""

    name: Literal["adamw", "lamb"] = "adamw"
    """adamw (the paper) or lamb (You et al. 2019, for very large batches: `bertdist.train.lamb`)."""
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    """Not applied to LayerNorm weights and biases. How it scales with the rate: weight_decay_mode."""
    weight_decay_mode: Literal["adamw", "independent"] = "adamw"
    """adamw (the paper's AdamWeightDecay, torch's AdamW): each step shrinks a matrix by lr x weight_decay.
    independent (ModernBERT's StableAdamW, optimi's decouple_lr): by weight_decay x lr / the peak lr, so
    weight_decay is the shrink per step at the peak (ModernBERT's 1e-5; as an adamw value it would be about
    1,000 times weaker, and torch's AdamW, the CPU path, rounds that away to nothing in fp32)."""
    grad_clip_norm: float = 1.0
    """0 disables clipping."""
    warmup_steps: int = 100
    schedule: Literal["linear", "wsd", "poly"] = "linear"
    """After warmup: linear (to 0 at the last step: the paper), wsd (warmup-stable-decay: the peak rate until the
    last decay_fraction of the steps, then down to 0; ModernBERT's trapezoidal schedule) or poly (NVIDIA's
    PolyWarmUpScheduler for LAMB: the peak x (1 - step / steps)^decay_power, the whole schedule's progress, so the
    rate starts below the peak where warmup ends). For the run's one schedule, or each phase's own (phase.lr)."""
    decay_fraction: float = 0.1
    """wsd: the share of the schedule's steps spent decaying (ModernBERT-style runs: 0.1-0.2)."""
    decay_shape: Literal["linear", "1-sqrt"] = "linear"
    """wsd: how the rate falls, linear or 1-sqrt (Hägele et al. 2024)."""
    decay_power: float = 0.5
    """poly: the power of the decay (NVIDIA's BERT: 0.5)."""
    fused: Literal["auto", "on", "off"] = "auto"
    """auto: DeepSpeed's FusedAdam on GPU, torch AdamW elsewhere; on/off force it."""


@dataclass
class TrainConfig:
    global_batch_size: int = 256
    """Sequences per optimizer step over all ranks (micro batch x ranks x accumulation)."""
    batch_warmup_tokens: int = 0
    """Batch-size warmup: the global batch ramps from batch_warmup_start to its full size over this many tokens
    (counted at full length), in multiples of batch_warmup_start (bertdist.config.batch_warmup); 0: off."""
    batch_warmup_start: int = 0
    """The ramp's first global batch, in sequences (ModernBERT: 768 rising to 4,608 over 50B tokens)."""
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    """fp32, fp16 (dynamic loss scaling) or bf16. fp16 needs a GPU for speed (its CPU path is for tests); bf16 runs
    on a CPU too, fast only where the CPU has bf16 matrix units."""
    zero_stage: int = 1
    seed: int = 1234
    output_dir: str = "runs/train"
    """Run directory: checkpoints, the local MLflow store, logs."""
    log_every_steps: int = 10
    eval_every_steps: int = 500
    eval_batches: int = 20
    max_nonfinite_steps: int = 20
    """Stop after this many consecutive steps with a non-finite loss."""
    rendezvous_timeout_s: float = 300.0
    """How long the ranks wait for each other at start-up before naming the missing side."""
    collective_timeout_s: float = 1800.0
    """How long one collective (all-reduce, barrier) may wait for a peer before it fails."""
    forecast_hours: float = 0.0
    """The wall time forecast for this run (`--calibrate`, bertdist.train.forecast); logged as plan/forecast_hours
    and compared at the end with plan/actual_hours. 0: none."""
    stall_timeout_s: float = 600.0
    """Stop the job when this rank makes no progress (no micro batch, eval batch or checkpoint file) for this
    long, naming the rank that stalled; 0 turns the watchdog off. Must exceed the slowest checkpoint save."""
    on_bad_step: Literal["stop", "rollback"] = "stop"
    """A non-finite loss (or a spike, with loss_spike_sigmas): stop: training goes on and stops after
    max_nonfinite_steps non-finite steps in a row (a spike is only said); rollback: back to the last checkpoint, the
    data read since skipped and recorded, and on (bertdist.train.rollback)."""
    loss_spike_sigmas: float = 0.0
    """A loss this many standard deviations above the mean of the last loss_spike_window_steps steps is a spike;
    0: only non-finite losses are bad steps."""
    loss_spike_window_steps: int = 100
    max_rollbacks: int = 3
    """Bad steps rolled back in one run (counted across resumes; a replayed one counts once); one more stops it,
    saying so."""
    replay_bad_steps: bool = True
    """With on_bad_step: rollback, a bad step is first replayed from the checkpoint (same data, same random
    streams): good now, the fault was transient and nothing is skipped; bad again, the data is named (shard and
    sample of every rank's batch) and skipped."""
    rollback_lr_factor: float = 1.0
    """After the k-th rollback that skips data, the scheduled learning rate is multiplied by this**k for the rest
    of the run (kept across resumes; logged as optimizer/lr_scale); 1: unchanged."""
    straggler_factor: float = 1.5
    """Name a rank whose time outside collectives (data wait + forward) is this many times the other ranks' median
    in two windows running, once, on the console and as an MLflow tag (bertdist.train.stragglers); 0 turns it off."""
    straggler_window_steps: int = 20
    """The steps each straggler comparison sums over (longer: steadier, named later: after two windows)."""
    data_wait_warn_fraction: float = 0.10
    """When the ranks wait for data longer than this fraction of a logging interval, say once, on the console and as
    an MLflow tag, what the loader's measurements point at: the object store, too few loader workers, or decoding
    (bertdist.train.data_wait); said again only after the wait has dropped below this and come back. 0 turns it
    off."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """Extra DeepSpeed config keys merged over the generated ones (for experts)."""


@dataclass
class CheckpointConfig:
    every_steps: int = 1000
    keep_last: int = 3
    resume: str = "auto"
    """auto: continue from the latest complete checkpoint if any; none: start fresh; or a path."""
    init_from_pretrained: str = ""
    """A Hugging Face BERT, ModernBERT or ALBERT directory to start from (continued pretraining)."""
    write: Literal["sync", "background"] = "sync"
    """sync: training waits while the files are written; background: the step that saves copies the state to host
    memory (one more copy of this rank's share while it is written) and a thread writes it while training goes
    on; the checkpoint is complete (and `latest` moves) when every rank's write is done
    (bertdist.train.background_save)."""
    verify: Literal["sha256", "size"] = "sha256"
    """Before loading a checkpoint, check its files against the record made at save: sha256 (every byte) or size."""
    uri: str = ""
    """Keep checkpoints here instead of OUTPUT/checkpoints, e.g. s3://bucket/run-1/checkpoints: each is saved
    under OUTPUT/checkpoints first, then uploaded while training goes on; `latest` names it once every file
    of every rank is in the store and verified (`bertdist.train.remote`)."""
    upload_timeout_s: float = 3600.0
    """How long the end of a run (or the next checkpoint) waits for an upload still in flight."""
    lease_timeout_s: float = 120.0
    """The run holds `checkpoint.uri` with a lease renewed every quarter of this; a lease not renewed for this
    long (its run was killed) is taken over by the next run (bertdist.lease)."""


@dataclass
class TrackingConfig:
    enabled: bool = True
    tracking_uri: str = ""
    """Empty: MLFLOW_TRACKING_URI if set, else the project's store: mlflow.db in the directory that holds the run
    directory (bertdist.tracking.store.store_dir), shared by the runs side by side there."""
    experiment_name: str = "bertdist"
    run_name: str = ""
    """Empty: `bert-{model.size}-{launch.job_name}-{start time}`, e.g. bert-tiny-demo-20261122-2346."""
    log_system_metrics: bool = True
    upload_checkpoints: bool = False
    """Upload checkpoint files as artifacts (multi-GB); by default only their paths are logged."""
    register_model_name: str = ""
    """Also register each `bertdist export` in the MLflow model registry under this name (a new version each)."""
    parent_run_id: str = ""
    """Nest a fine-tuning run under this MLflow run (`bertdist evaluate` sets it: one child per task and setting)."""


@dataclass
class LaunchConfig:
    backend: Literal["local", "deepspeed", "slurm", "ray"] = "local"
    """local, deepspeed (hostfile over SSH), slurm or ray."""
    nodes: int = 1
    gpus_per_node: int = 1
    """Ranks per node (GPUs, or CPU processes on a machine without GPUs)."""
    hostfile: str = ""
    master_port: int = 29500
    time_limit: str = "24:00:00"
    partition: str = ""
    job_name: str = "bertdist"
    # Elastic jobs (deepspeed and ray backends: bertdist.launch.elastic). `nodes` is the most a job uses.
    min_nodes: int = 0
    """Fewest nodes the job continues on after losing hosts (0: `nodes`, never fewer than asked); below it the
    job stops with its last checkpoint kept. `bertdist submit --nodes 2-4` sets min_nodes 2 and nodes 4."""
    max_restarts: int = 10
    """Relaunches (after a lost host, a stall, or to grow back) before the job gives up; a grow-back is only
    started while another relaunch would be left after it."""
    restart_backoff_s: float = 10.0
    """Wait before relaunching after a failure; doubles after each failure with no new checkpoint between."""
    grow_back: bool = True
    """Take a lost host back (at a checkpoint the job asks for) once it has answered for `readmit_after_s`."""
    readmit_after_s: float = 60.0
    """How long a lost host must answer every probe before it is taken back, doubled for each time it was lost
    before (a flapping host stays out longer each time)."""
    host_probe_interval_s: float = 10.0
    """How often every host is probed (SSH or the Ray node table); two failed probes in a row lose it."""
    stop_timeout_s: float = 600.0
    """How long ranks asked to checkpoint and stop (to grow back) may take before they are killed."""

    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def fewest_nodes(self) -> int:
        return self.min_nodes or self.nodes


@dataclass
class DistillConfig:
    """Knowledge distillation (`model.objective: distill`; DistilBERT, Sanh et al. 2019, arXiv 1910.01108, section
    3): the student learns from a frozen teacher run in eval mode on every rank beside it. The loss is
    kd_weight x the soft-target loss (KL divergence of the student's distribution from the teacher's at
    `temperature`, x temperature^2, at the masked positions) + mlm_weight x MLM + cos_weight x (1 - cosine) of the
    two last hidden states at every token; the paper's weights 5 / 2 / 1 and temperature 2 are the defaults."""

    teacher: str = ""
    """A Hugging Face BERT directory (config.json model_type bert: a `bertdist export` of a BERT run, or a
    transformers BERT), with the tokenizer of data.vocab_file."""
    student_layers: list[int] = field(default_factory=list)
    """The teacher's layers the student's start from, one per student layer (0-based); empty: every other one
    (0, 2, 4, ...: the paper's "one layer out of two"). Only a fresh run copies them."""
    temperature: float = 2.0
    kd_weight: float = 5.0
    mlm_weight: float = 2.0
    cos_weight: float = 1.0


@dataclass
class EvalConfig:
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)


def phase_index(phase_steps: list[int], step: int) -> tuple[int, int]:
    """(index, end step) of the phase holding 0-based optimizer step `step`, the phases being `phase_steps` steps
    long; past the last phase, the last one. A run's Config and a checkpoint's recorded config both ask here."""
    end = 0
    for index, steps in enumerate(phase_steps):
        end += steps
        if step < end:
            return index, end
    return len(phase_steps) - 1, end


def phase_model_config(model_cfg: ModelConfig, phase: PhaseConfig) -> ModelConfig:
    """The model's settings in `phase`: its RoPE thetas where the phase sets them (a context-extension phase)."""
    thetas = {k: getattr(phase, k) for k in ("global_rope_theta", "local_rope_theta") if getattr(phase, k)}
    return dataclasses.replace(model_cfg, **thetas) if thetas else model_cfg


def checkpoint_model_config(run_config: dict[str, Any], step: int) -> ModelConfig:
    """The model of a checkpoint after `step` steps of the run whose resolved config is `run_config`: the run's
    model in the phase of its last step (what an export or a fine-tuning must build)."""
    phases = [PhaseConfig(**p) for p in run_config["data"]["phases"]]
    index, _ = phase_index([p.steps for p in phases], step - 1)
    return phase_model_config(ModelConfig(**run_config["model"]), phases[index])


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    def total_steps(self) -> int:
        return sum(p.steps for p in self.data.phases)

    def global_batch_size(self, phase: PhaseConfig) -> int:
        return phase.global_batch_size or self.train.global_batch_size

    def gradient_accumulation_steps(self, phase: PhaseConfig, world_size: int) -> int:
        return self.global_batch_size(phase) // (phase.micro_batch_size * world_size)

    def first_step(self, index: int) -> int:
        """The first optimizer step of phase `index`."""
        return sum(p.steps for p in self.data.phases[:index])

    def masking(self, phase: PhaseConfig) -> MaskingConfig:
        """The masking rules of `phase`: data.masking with the phase's own rate and split where it sets them."""
        own = {
            "masked_lm_prob": phase.masked_lm_prob if phase.masked_lm_prob else None,
            "mask_token_fraction": phase.mask_token_fraction if phase.mask_token_fraction >= 0 else None,
            "random_token_fraction": phase.random_token_fraction if phase.random_token_fraction >= 0 else None,
        }
        return dataclasses.replace(self.data.masking, **{k: v for k, v in own.items() if v is not None})

    def phase_at(self, step: int) -> tuple[int, PhaseConfig]:
        """The phase (index, config) that optimizer step `step` (0-based) belongs to."""
        index, _ = phase_index([phase.steps for phase in self.data.phases], step)
        return index, self.data.phases[index]

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists (tuples become lists), as YAML and JSON write them."""
        return _to_plain(dataclasses.asdict(self))


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj
