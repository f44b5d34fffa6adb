"""The MLflow pyfunc model of a bertdist export: fill-mask queries answered by `transformers`.

This file is not imported by bertdist. `bertdist.tracking.models` gives its path to MLflow ("models from
code"), which copies it into the logged model; `mlflow.pyfunc.load_model` runs it there, so a model loads
wherever `mlflow`, `torch` and `transformers` are installed, without bertdist and without unpickling
anything. The Hugging Face directory travels as the model's artifact `hf_model`.

    model = mlflow.pyfunc.load_model("models:/bert-tiny-demo/1")
    model.predict(pandas.DataFrame({"text": ["Return a [MASK] of the list."]}))
    # one row per candidate: text_index, rank, token, score, sequence
"""

import mlflow
from mlflow.pyfunc import PythonModel

TOP_K = 5


class FillMask(PythonModel):
    def load_context(self, context):
        from transformers import pipeline

        self.pipeline = pipeline("fill-mask", model=context.artifacts["hf_model"], top_k=TOP_K)

    def predict(self, context, model_input, params=None):
        import pandas

        texts = model_input["text"].tolist() if hasattr(model_input, "columns") else list(model_input)
        rows = []
        for index, text in enumerate(texts):
            candidates = self.pipeline(text)
            if candidates and isinstance(candidates[0], list):  # several [MASK]s: the first one's candidates
                candidates = candidates[0]
            for rank, c in enumerate(candidates):
                rows.append(
                    dict(text_index=index, rank=rank, token=c["token_str"], score=c["score"], sequence=c["sequence"])
                )
        return pandas.DataFrame(rows, columns=["text_index", "rank", "token", "score", "sequence"])


mlflow.models.set_model(FillMask())
