"""The second stage of BERT: fine-tuning and judging a pretrained model on downstream tasks.

runner        `bertdist finetune`: one task on the pretraining engine (DeepSpeed, any launcher), its loop
starting      the task model and its DeepSpeed engine; an interrupted run's epoch checkpoint restored
evaluation    the dev sets scored after every epoch, a share per rank, the metrics on every rank
best_model    the best epoch's model exported (Hugging Face directory, results.json) as soon as it is found
run_tracking  the fine-tuning's MLflow run: its parameters and where it started
task          what each finetune.task trains: head, encoded rows, dev metrics
data          labelled rows from CSV/TSV/JSONL; classification and regression encoding
tagging       CoNLL files, word labels on first sub-tokens, entity scores
squad         SQuAD JSON, sliding windows, span decoding, v2.0's null threshold
choice        multiple choice (SWAG-style) rows
features      encoded rows padded per batch (shared by every task)
embed         `bertdist embed`: features of a frozen model (a layer, the last four, the pooler) in .npy shards
suites        `bertdist evaluate`: GLUE (or a suite file) with the paper's sweep, one MLflow parent run
commands      the command lines of pairs, finetune, embed, attention and evaluate
source        where a run starts: checkpoint, export, Hugging Face BERT/ModernBERT, random initialisation
corpus_tasks  labelled tasks of each kind made from raw text (the demo, the tests)
pairs         `bertdist pairs`: contrastive (query, positive) pairs mined from an unlabelled corpus, a dev collection
metrics       the standard task metrics: accuracy, F1, Matthews, Pearson/Spearman, entity F1, SQuAD EM/F1
"""
