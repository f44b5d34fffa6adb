"""The pretraining objectives that compose over any encoder: masked LM (`masked_lm`), the sentence classifier of
next-sentence and sentence-order prediction (`sentence`), SpanBERT's span boundaries (`span_boundary`), and the one
place they are put together with an encoder (`compose`).

The contract (`contract.Objective`): an objective declares the batch fields it reads, where the encoder's last
layer must run for it (`queries`: a few positions per sample, or every position), and turns the states there into
a `Part`: its logits, its loss and the labels its accuracy is scored on. Its heads are the family's modules, under
the family's names (BERT's `cls.predictions`, RoBERTa's `lm_head`, ALBERT's `sop_classifier`), which the family's
Hugging Face adapter maps; an objective whose head no Hugging Face class has says so (`exported`), and the export
leaves that head out. `compose.ComposedPretraining` is a pretraining model made of an encoder and objectives: a
family's model says how it encodes and which objectives (with which of its heads) its config trains, and the one
`forward` here runs the encoder once, at the union of the objectives' positions, and sums their losses.

ELECTRA's replaced-token detection and DistilBERT's distillation stay with their families (their forwards run a
second encoder), behind the same output: their parts are `Part`s too, summed by `compose.outcome`.
"""
