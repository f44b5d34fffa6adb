"""The schema's second-stage sections: `bertdist finetune` (`finetune:`) and fine-tuning during pretraining
(`eval.downstream`). Part of the single schema (bertdist.config.schema composes them into `Config`); apart only
so that each module stays one screenful of concerns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class FinetuneConfig:
    """`bertdist finetune`: one downstream task on a pretrained BERT, with the paper's recipe as defaults.

    Shared with pretraining: optim.name/betas/eps/weight_decay/weight_decay_mode/grad_clip_norm,
    train.precision/zero_stage/seed, tracking and launch. The model's dimensions come from `init_from`; model.*
    dropout, attention, compile and classifier_pooling settings apply. Pretraining's rate, schedule and batch
    (optim.lr, optim.warmup_steps, optim.schedule, optim.decay_*, train.global_batch_size) are refused: finetune.lr,
    finetune.warmup_proportion and finetune.batch_size set them.
    """

    task: Literal[
        "classification", "regression", "token_classification", "question_answering", "multiple_choice", "embedding"
    ] = "classification"
    """classification (one text or a pair, any number of labels), regression (one score, MSE),
    token_classification (CoNLL files), question_answering (SQuAD v1.1/v2.0 JSON), multiple_choice, or embedding
    (query-passage pairs, contrastive: a sentence-transformers model)."""
    init_from: str = ""
    """A bertdist run directory or checkpoint (step_N), its export, or any Hugging Face BERT or ModernBERT directory;
    empty: random initialisation of model.* (the baseline a pretrained model must beat)."""
    vocab_file: str = ""
    """The tokenizer (a vocab.txt, a tokenizer.json, or a directory holding either); empty: the one of init_from
    (a run's data.vocab_file, or an export's or HF directory's tokenizer.json, else its vocab.txt)."""
    train_file: str = ""
    """CSV, TSV or JSON lines (by extension) with a header / keys naming the columns."""
    dev_file: str = ""
    """Like train_file; for embedding also a BEIR-format directory (corpus.jsonl, queries.jsonl, qrels/dev.tsv:
    `bertdist pairs --dev-dir` writes one), whose queries search its whole corpus."""
    text_column: str = "sentence"
    text_pair_column: str = ""
    """Empty: single sentences; else the column of the second text ([CLS] A [SEP] B [SEP])."""
    label_column: str = "label"
    """Classification: the class; regression: the score; multiple choice: the right choice's index (0-based)."""
    columns: str = ""
    """For CSV/TSV files without a header row: their column names, comma-separated (GLUE's CoLA)."""
    extra_dev_files: str = ""
    """Classification/regression: more dev files (comma-separated) scored every epoch as `<file stem>/<metric>`
    (MNLI's dev_mismatched.tsv); the best epoch is still chosen on dev_file."""
    choice_columns: str = ""
    """Multiple choice: the columns of the candidate endings, comma-separated (SWAG:
    ending0,ending1,ending2,ending3)."""
    negative_columns: str = ""
    """Embedding: columns of hard-negative passages, comma-separated (text_column: the query; text_pair_column: its
    positive)."""
    pooling: Literal["", "mean", "cls"] = ""
    """Embedding: a text's vector is the mean of the last layer over its tokens, or its [CLS] state; empty: the
    pooling of a sentence-transformers directory in init_from (a CLS-trained model fine-tuned with mean pooling
    starts from vectors it was never trained to give), else mean."""
    temperature: float = 0.05
    """Embedding: InfoNCE's softmax temperature over cosine similarities (sentence-transformers' scale 20)."""
    matryoshka_dims: str = ""
    """Embedding: nested prefixes of the vector to train, comma-separated and decreasing, e.g. 256,128,64
    (Matryoshka representation learning; sentence-transformers' MatryoshkaLoss): the loss is the sum of InfoNCE
    over each prefix, so a vector cut to any of them (sentence-transformers' truncate_dim) still retrieves. Empty:
    the whole vector only; list the hidden size first to keep the whole vector in the loss (a run whose first width
    is below it says so). The dev metrics are reported at every dimension, the export records them."""
    no_duplicates: bool = True
    """Embedding: no text twice in a step (a row whose query, positive or negatives are in the step already waits for
    the next; sentence-transformers' BatchSamplers.NO_DUPLICATES, which its documentation recommends for in-batch
    losses): a passage twice in the step is a negative equal to a positive (bertdist.finetune.batches). false: the
    epoch's seeded order as it is (sentence-transformers' default sampler). Other tasks have no in-batch negatives
    and ignore it."""
    on_bad_input: Literal["error", "skip"] = "error"
    """error: stop at the first bad row naming file and line; skip: skip such rows and report how many."""
    max_seq_length: int = 0
    """0: the task's usual length, 384 for question_answering (the paper's SQuAD setting) and 128 otherwise,
    or the model's max_position_embeddings where that is shorter."""
    doc_stride: int = 128
    """Question answering: tokens between the starts of a passage's windows."""
    max_query_length: int = 64
    """Question answering: a longer question is cut to this many tokens."""
    max_answer_length: int = 30
    """Question answering: the longest span (tokens) a prediction may be."""
    n_best_size: int = 20
    """Question answering: starts and ends considered per window when decoding a span."""
    batch_size: int = 32
    """Rows per optimizer step over all ranks (a row: a text or pair, a SQuAD window, a question with its choices)."""
    micro_batch_size: int = 32
    cache_rows: int = 0
    """Embedding: 0, off (negatives come from one micro batch of every rank); N: the contrastive batch is each
    rank's whole share of the step (batch_size / ranks rows, every rank's gathered), encoded N rows at a time
    through a gradient cache (bertdist.finetune.grad_cache), so that memory follows N and the negatives the step.
    N must divide batch_size / ranks; micro_batch_size then sets only the dev batches."""
    epochs: float = 3.0
    best_metric: str = ""
    """The dev metric (on dev_file) whose best evaluation is kept: the model exported, the `best/` metrics, what a
    suite reports. Empty: the task's headline (accuracy, pearson, entity f1, SQuAD f1, nDCG@10). A GLUE suite sets
    each task's reported metric (CoLA's matthews, QQP's and MRPC's f1, STS-B's spearman), so that the epoch it
    reports is the best one by that metric, not by accuracy."""
    eval_every_steps: int = 0
    """0: the dev set is scored after every epoch; N: also every N steps (a checkpoint with it, and the best model
    exported as soon as it is found), so that a one-epoch contrastive pretraining has a curve and a best step."""
    lr: float = 2e-5
    warmup_proportion: float = 0.1
    """Share of the steps with linear warmup; then linear decay to zero (BERT's fine-tuning schedule)."""
    output_dir: str = "runs/finetune"

    def sequence_length(self, model_positions: int) -> int:
        """max_seq_length, or the task's usual length where the model has that many positions."""
        return self.max_seq_length or min(384 if self.task == "question_answering" else 128, model_positions)

    def engine_micro_batch_size(self) -> int:
        """Rows per forward and backward with gradients: a cache chunk where the gradient cache is on."""
        return self.cache_rows or self.micro_batch_size

    def gradient_accumulation_steps(self, world_size: int) -> int:
        """Backwards per optimizer step on each of `world_size` ranks (DeepSpeed's accumulation)."""
        return self.batch_size // (self.engine_micro_batch_size() * world_size)

    def choices(self) -> tuple[str, ...]:
        return _names(self.choice_columns)

    def header(self) -> tuple[str, ...]:
        return _names(self.columns)

    def negatives(self) -> tuple[str, ...]:
        return _names(self.negative_columns)

    def extra_dev(self) -> tuple[str, ...]:
        return _names(self.extra_dev_files)

    def dims(self) -> tuple[int, ...]:
        """matryoshka_dims as integers (validated: bertdist.config.validation.finetune)."""
        return tuple(int(d) for d in _names(self.matryoshka_dims))


def _names(comma_separated: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in comma_separated.split(",") if c.strip())


@dataclass
class DownstreamConfig:
    """Fine-tune copies of the checkpoints on a small task during pretraining (bertdist.train.downstream)."""

    config: str = ""
    """A `bertdist finetune` YAML naming the task (files, task, lr, epochs); empty: off."""
    name: str = "task"
    """Metrics are logged as downstream/<name>/<metric>."""
    every_checkpoints: int = 1
    """Evaluate every N-th checkpoint (checkpoint.every_steps x N steps apart)."""
    timeout_s: float = 3600.0
    """How long the end of training waits for the last evaluation."""
