"""The models: encoder families in plain PyTorch, one folder each, and what every family shares.

registry        the one table of families (model.arch -> bertdist.model.<arch>'s spec); build_model(cfg.model)
spec            FamilySpec: what the rest of bertdist asks of a family (torch-free; names its modules)
bert/           BERT: model, layers (which ALBERT, ELECTRA, DistilBERT and RoBERTa reuse), pretraining heads, hf, tasks
modernbert/     ModernBERT: RoPE, GeGLU, pre-norm, global and sliding-window layers; hf, tasks
albert/         ALBERT: factorized embeddings, shared layers, sentence order; hf, tasks
electra/        ELECTRA: generator and discriminator; hf (two directories), tasks
distilbert/     DistilBERT: BERT's layer, half the depth, no segments; hf, tasks
roberta/        RoBERTa and XLM-R: BERT's layers, positions past the padding index, masked LM only; hf, tasks
rotary          RoPE as one autograd function over the fused QKV projection (ModernBERT)
layout          padded, unpadded and packed batches: where each sample's tokens are, attention per sample
ops             faster operators: CPU dropout, attention over heads, tied logits, the MLM cross-entropy
outputs         what a pretraining model returns: logits, the loss, its named parts and scored heads
hf_io           Hugging Face directories: config.json and weights read and checked, files written
hf_limits       the sizes and shapes a config.json or a checkpoint may have, checked before anything is built
hf_heads        fine-tuned models in the Hugging Face format, any family (its spec's `tasks()`)
task_heads      what every family's task models share: losses, TaskModel and its kinds, TaskFamily
sentence        sentence-transformers directories: pooling, normalisation, the length texts are cut at
onnx            ONNX export of a pretraining, task or sentence model
flops           training FLOPs as the model class counts them (each layer and head: `forward_flops`),
                parameters by architecture, and the peak FLOP/s MFU is measured against
"""
