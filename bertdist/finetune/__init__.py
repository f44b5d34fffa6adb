"""The second stage of BERT: fine-tuning and judging a pretrained model on downstream tasks.

    metrics      the standard task metrics: accuracy, F1, Matthews, Pearson/Spearman, entity F1, SQuAD EM/F1
"""
