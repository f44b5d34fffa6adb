"""The models: encoders in plain PyTorch and what is computed about them.

registry        model.arch -> the model class and its Hugging Face adapter; build_model(cfg.model)
bert            BertForPreTraining with Hugging Face's module and parameter names (torch only)
bert_layers     BERT's embeddings, attention, feed-forward and layer stack (ALBERT and ELECTRA reuse them)
modernbert      ModernBertForMaskedLM: RoPE, GeGLU, pre-norm, global and sliding-window layers (torch only)
rotary          RoPE as one autograd function over the fused QKV projection (ModernBERT)
albert          AlbertForPreTraining: factorized embeddings, layers sharing parameters, sentence order (torch only)
layout          padded, unpadded and packed batches: where each sample's tokens are, attention per sample
ops             faster operators: CPU dropout, attention over heads, tied logits, the MLM cross-entropy
outputs         what a pretraining model returns: logits, the loss, its named parts and scored heads
hf              BERT to and from the Hugging Face format (the model never imports it)
modernbert_hf   ModernBERT to and from the Hugging Face format
albert_hf       ALBERT to and from the Hugging Face format
modernbert_heads ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}
hf_heads        fine-tuning heads in the Hugging Face format
heads           fine-tuning heads (classification, tagging, QA, multiple choice)
flops           training FLOPs as the model class counts them (each layer and head: `forward_flops`),
                parameters by architecture, and the peak FLOP/s MFU is measured against
"""
