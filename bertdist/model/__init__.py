"""The model: BERT in plain PyTorch and what is computed about it.

    bert   BertForPreTraining with Hugging Face's module and parameter names (torch only)
    ops    its faster operators: CPU dropout, the MLM cross-entropy
    hf     the one-way adapter to and from the Hugging Face format (the model never imports it)
    flops  FLOPs per sequence and the peak FLOP/s that MFU is measured against
"""
