"""What a training config will do, computed without starting anything: `bertdist train --dry-run`."""

from __future__ import annotations

from bertdist.config import Config
from bertdist.config.batch_warmup import batch_schedule, phase_sequences
from bertdist.config.objectives import objective
from bertdist.model.flops import (
    parameter_counts,
    train_flops_per_sequence,
    trained_predictions,
)
from bertdist.train.optim import decay_steps


def describe_plan(cfg: Config, world_size: int) -> str:
    """A human-readable plan: world size, accumulation, steps, sequences, tokens and FLOPs per phase."""
    m = cfg.model
    total, outside_tables = parameter_counts(m)  # one model built on the meta device
    lines = [
        f"model: {m.size} (L={m.num_layers}, H={m.hidden_size}, A={m.num_attention_heads}), "
        f"{total / 1e6:.1f}M parameters ({outside_tables / 1e6:.1f}M non-embedding)",
        f"world size: {world_size} ({cfg.launch.nodes} node(s) x {cfg.launch.gpus_per_node} rank(s)), "
        f"precision {cfg.train.precision}, ZeRO stage {cfg.train.zero_stage}",
        f"global batch: {cfg.train.global_batch_size} sequences unless a phase sets its own "
        "(samples, whatever the row layout: "
        f"{'packed several per row' if cfg.data.packing else 'one per row'}; "
        f"encoder {'unpadded' if m.unpad else 'padded'})",
    ]
    lines += objective(m).plan_lines(cfg)
    if cfg.train.batch_warmup_tokens:
        lines.append(
            f"batch warmup: from {cfg.train.batch_warmup_start:,} sequences to each phase's global batch over "
            f"{cfg.train.batch_warmup_tokens:,} tokens (at full length), in multiples of "
            f"{cfg.train.batch_warmup_start:,}: " + _ramp(cfg, world_size)
        )
    total_tokens = total_flops = 0.0
    first = 0
    for i, (ph, sequences) in enumerate(zip(cfg.data.phases, phase_sequences(cfg))):
        tokens = sequences * ph.max_seq_length
        mk = cfg.masking(ph)
        predictions, cut = trained_predictions(ph.max_seq_length, mk.masked_lm_prob, mk.max_predictions_per_seq)
        flops = sequences * train_flops_per_sequence(m, ph.max_seq_length, predictions)
        total_tokens += tokens
        total_flops += flops
        lines.append(
            f"phase {i}: steps {first}..{first + ph.steps - 1} ({ph.steps:,}), length {ph.max_seq_length}, "
            f"global batch {cfg.global_batch_size(ph):,}, micro batch {ph.micro_batch_size}, "
            f"gradient accumulation {cfg.gradient_accumulation_steps(ph, world_size)}, "
            + (
                f"lr {ph.lr:g} with {_after_warmup(cfg, ph.warmup_steps, ph.steps, ph.decay_fraction, first)}, "
                if ph.lr
                else ""
            )
            + (
                f"masking {mk.masked_lm_prob:.0%} ({mk.mask_token_fraction:.0%} [MASK], {mk.random_token_fraction:.0%} "
                "random), "
                if mk != cfg.data.masking
                else ""
            )
            + (
                f"masking cut to {predictions} predictions a sample by max_predictions_per_seq (an effective "
                f"{predictions / ph.max_seq_length:.1%} of {mk.masked_lm_prob:.0%}), "
                if cut
                else ""
            )
            + f"{sequences:,} sequences, {tokens:,.0f} tokens, {flops:.3e} FLOPs, "
            + (_mixture(cfg, i, tokens) if ph.mixture else f"shards {ph.train_dir}")
        )
        first += ph.steps
    o = cfg.optim
    schedule = (
        f"each phase its own (above), {o.name}"
        if cfg.data.phases[0].lr
        else f"{o.name}, lr {o.lr:g}, {_after_warmup(cfg, o.warmup_steps, cfg.total_steps(), o.decay_fraction)}"
    )
    lines += [
        f"schedule: {schedule}",
        f"total: {cfg.total_steps():,} steps, {total_tokens:,.0f} tokens, {total_flops:.3e} training FLOPs "
        f"(upper bound at full length; short sequences lower it)",
    ]
    return "\n".join(lines)


def _mixture(cfg: Config, index: int, tokens: float) -> str:
    """`mixture web 75.0% (768,000 tokens), wiki 25.0% (256,000 tokens)`: each source's expected tokens (at full
    length); by temperature, once the sources' manifests count their tokens."""
    from bertdist.errors import DataError
    from bertdist.train.loaders import phase_shares

    phase = cfg.data.phases[index]
    try:
        shares = phase_shares(cfg, index)
    except DataError:  # not prepared yet: the shares follow from their token counts
        return f"mixture of {', '.join(phase.mixture)} by temperature {phase.mixture_temperature:g} (once prepared)"
    return "mixture " + ", ".join(f"{n} {p:.1%} ({p * tokens:,.0f} tokens)" for n, p in shares.items())


def _ramp(cfg: Config, world_size: int) -> str:
    """`steps 0..12,715 at 768 (accumulation 6), ...`: the batch sizes of the ramp, each with its steps."""
    ramp = [s for s in batch_schedule(cfg) if s.tokens_before < cfg.train.batch_warmup_tokens]
    micro = [ph.micro_batch_size * world_size for ph in cfg.data.phases]
    return ", ".join(
        f"steps {s.first_step:,}..{s.first_step + s.steps - 1:,} at {s.global_batch_size:,} (accumulation "
        f"{s.global_batch_size // micro[s.phase]})"
        for s in ramp
    )


def _after_warmup(cfg: Config, warmup_steps: int, steps: int, phase_fraction: float, first: int = 0) -> str:
    """`2,000 warmup steps then linear decay to 0 at step 100,000`, or the stable and decay steps of `wsd`; of a
    phase's own schedule, its steps start at `first` (the run's step numbers, as the phase line's range)."""
    o = cfg.optim
    if o.schedule == "linear":
        return f"{warmup_steps:,} warmup steps then linear decay to 0 at step {first + steps:,}"
    if o.schedule == "poly":
        since = f"(step - {first:,})" if first else "step"
        return f"{warmup_steps:,} warmup steps then (1 - {since}/{steps:,})^{o.decay_power:g} (poly)"
    decay = decay_steps(steps, o.decay_fraction if phase_fraction < 0 else phase_fraction)
    return (
        f"{warmup_steps:,} warmup steps, stable to step {first + steps - decay:,}, then {o.decay_shape} decay to 0 "
        f"over {decay:,} steps (wsd)"
    )
