"""bertdist: pretrain BERT at scale (Ray preprocessing, DeepSpeed training, MLflow tracking)."""

__version__ = "0.1.0"
