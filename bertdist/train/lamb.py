"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes").

Adam's bias-corrected update plus decoupled weight decay, rescaled per parameter tensor by the trust ratio
||w|| / ||update||, so that every layer moves by about the same fraction of its norm whatever the scale of
its gradient: what lets BERT train at a batch of 32k-64k sequences. As NVIDIA's BERT recipe (apex FusedLAMB,
`use_nvlamb=False`), tensors without weight decay (biases, LayerNorm) take Adam's step unscaled.

This is the PyTorch implementation used on every device. DeepSpeed's FusedLamb is not used: it clamps the
ratio to [0.01, 10] and applies it to biases and LayerNorm too, which is another recipe than NVIDIA's.

The ratio is per tensor, so the optimizer must see whole tensors: ZeRO (which hands it flat partitions) and
DeepSpeed's bf16 optimizer (which flattens the parameters) are refused with LAMB by the config validation.
"""

from __future__ import annotations

import math

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        decay = group["weight_decay"]
        for p in params:
            if not self.state[p]:
                self.state[p].update(
                    step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                )
        states = [self.state[p] for p in params]
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        for s in states:
            s["step"] += 1
        steps = [float(s["step"]) for s in states]

        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denominators, [math.sqrt(1 - beta2**t) for t in steps])
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(exp_avgs, denominators)
        torch._foreach_div_(updates, [1 - beta1**t for t in steps])
        if decay:
            torch._foreach_add_(updates, params, alpha=decay)
            weight_norms, update_norms = torch._foreach_norm(params), torch._foreach_norm(updates)
            ratios = [
                torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) for w, u in zip(weight_norms, update_norms)
            ]
            torch._foreach_mul_(updates, ratios)
        torch._foreach_add_(params, updates, alpha=-group["lr"])
