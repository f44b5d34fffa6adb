"""A sentence encoder: an encoder family's bare encoder and a pooling of its last layer into one vector per text,
for contrastive fine-tuning (`finetune.task=embedding`), and the sentence-transformers directory it is saved as.

The vector is the mean of the last layer over a text's tokens ([CLS] and [SEP] included, padding not) or its
[CLS] state, not normalised: the loss and the retrieval scores normalise (cosine similarity), and so does
sentence-transformers' default similarity. No projection sits on top, so the saved directory is the encoder
alone plus sentence-transformers' Pooling: what `SentenceTransformer(DIR)` computes is exactly what this module
and `bertdist embed --pooling` compute (tests/finetune/test_embedding.py compares the three at 1e-5).

The directory (`save_sentence_transformer`): the family's Hugging Face files (config.json naming `BertModel` or
`ModernBertModel`, model.safetensors, the tokenizer), `modules.json` (a Transformer module at the root, then
`1_Pooling`), `sentence_bert_config.json` (max_seq_length), `1_Pooling/config.json` (mean or cls) and
`config_sentence_transformers.json` (cosine similarity). bertdist reads it back like any Hugging Face directory
of the family (`finetune.init_from`, `bertdist embed`, `bertdist evaluate --suite retrieval`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.hf_heads import family_of
from bertdist.model.hf_io import CheckpointFormatError
from bertdist.model.modernbert.tasks import pool
from bertdist.model.task_heads import TaskOutput

SENTENCE_EMBEDDING = "SentenceEmbedding"
"""A fine-tuning task's head (bertdist.finetune.task): this module's model, not a `transformers` task class."""


class SentenceEmbedder(nn.Module):
    """`forward(input_ids, attention_mask, token_type_ids) -> TaskOutput(None, vectors)`: (rows, [group,] hidden)
    vectors for (rows, [group,] seq) inputs; a group is a query with its passages (contrastive training)."""

    reads_optional_weights = False
    """Its pooling is of the last layer: a pooler (or ModernBERT's head) the encoder holds is never read
    (bertdist.model.hf_heads.load_encoder)."""

    def __init__(
        self, cfg: ModelConfig, pooling: str = "mean", normalize: bool = False, truncate_dim: int | None = None
    ):
        """`normalize`: unit-length vectors, as a released directory whose pipeline ends in Normalize gives them;
        `truncate_dim`: the first components only, cut after that, as its config_sentence_transformers.json's
        truncate_dim cuts them (both read back by `read_sentence_embedder`; bertdist's own training leaves the
        vectors whole and unnormalised)."""
        super().__init__()
        if pooling not in ("mean", "cls"):  # finetune.pooling
            raise ValueError(f"pooling must be mean or cls, got {pooling!r}")
        family = family_of(cfg.arch)
        self.config, self.pooling, self.inputs, self.encoder_name = cfg, pooling, family.inputs, family.encoder_name
        self.normalize, self.truncate_dim = normalize, truncate_dim
        setattr(self, family.encoder_name, family.encoder(cfg))  # the name the family's checkpoints use
        self.apply(lambda module: family.init_weights(module, cfg))  # a random start; pretrained weights overwrite

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **targets: Any,
    ) -> TaskOutput:
        """`targets` (a batch's other fields) are ignored: the contrastive loss is computed across ranks by the
        fine-tuning runner (bertdist.finetune.contrastive), which a model cannot see."""
        length = input_ids.shape[-1]
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        flat = {k: v.reshape(-1, length) for k, v in given.items() if k in self.inputs and v is not None}
        states, layout = getattr(self, self.encoder_name).encode(**flat)
        vectors = pool(states, layout, flat.get("attention_mask"), self.pooling)
        if self.normalize:
            vectors = nn.functional.normalize(vectors, dim=-1)
        if self.truncate_dim:
            vectors = vectors[..., : self.truncate_dim]
        return TaskOutput(None, vectors.reshape(*input_ids.shape[:-1], vectors.shape[-1]))


def save_sentence_transformer(
    model: SentenceEmbedder,
    directory: str | os.PathLike,
    vocab_file: str | os.PathLike | None,
    max_seq_length: int,
    extra_config: dict[str, Any] | None = None,
    matryoshka_dims: tuple[int, ...] = (),
) -> None:
    """Write `directory` for `sentence_transformers.SentenceTransformer(directory)` (offline) and for bertdist.

    `matryoshka_dims`, the prefixes the model was trained to retrieve with (finetune.matryoshka_dims), are recorded
    in config_sentence_transformers.json (which sentence-transformers keeps and ignores) and named in a README, so
    that a user knows which `SentenceTransformer(DIR, truncate_dim=D)` were trained for, and `bertdist evaluate
    --suite retrieval` scores each of them."""
    directory = Path(directory)
    family = family_of(model.config.arch)
    family.write_directory(
        model, directory, vocab_file, {"architectures": [f"{family.prefix}Model"], **(extra_config or {})}
    )
    _write_json(
        directory / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ],
    )
    _write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    _write_json(
        directory / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": model.config.hidden_size,
            "pooling_mode_cls_token": model.pooling == "cls",
            "pooling_mode_mean_tokens": model.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "include_prompt": True,
        },
    )
    dims = {"matryoshka_dims": list(matryoshka_dims)} if matryoshka_dims else {}
    _write_json(
        directory / "config_sentence_transformers.json", {"similarity_fn_name": "cosine", "prompts": {}, **dims}
    )
    if matryoshka_dims:
        widths = ", ".join(str(d) for d in matryoshka_dims)
        (directory / "README.md").write_text(
            "# A bertdist sentence encoder\n\n"
            f"Trained with a Matryoshka loss: its vectors cut to {widths} dimensions retrieve on their own.\n\n"
            "```python\nfrom sentence_transformers import SentenceTransformer\n\n"
            f'model = SentenceTransformer("{directory.name}", truncate_dim={matryoshka_dims[-1]})\n```\n'
        )


def read_sentence_embedder(directory: str | os.PathLike, unpad: bool = True) -> SentenceEmbedder:
    """The sentence encoder of a sentence-transformers directory of a family bertdist reads (its Transformer
    module at the root, then Pooling), in bertdist's form. `unpad` False: padded, as a traced graph needs."""
    import dataclasses

    from bertdist.model.hf_heads import load_encoder, read_pretrained

    pipeline = read_sentence_pipeline(directory)
    if pipeline is None:
        raise CheckpointFormatError(f"{directory}: no sentence-transformers Pooling module: not a sentence encoder")
    pipeline.own_vectors()
    cfg, state, source = read_pretrained(directory)
    settings = (pipeline.pooling, pipeline.normalize, pipeline.truncate_dim)
    model = SentenceEmbedder(dataclasses.replace(cfg, unpad=unpad), *settings)
    load_encoder(model, state, source)
    return model


@dataclass(frozen=True)
class SentencePipeline:
    """What a sentence-transformers directory computes after its encoder, as far as bertdist reproduces it."""

    pooling: str
    """mean or cls."""
    normalize: bool
    """A Normalize module follows the pooling: the vectors are of unit length."""
    max_seq_length: int | None
    """sentence_bert_config.json's: the length texts are cut to (None: not set)."""
    matryoshka_dims: tuple[int, ...] = ()
    """The vector prefixes the model was trained to retrieve with (bertdist's record; () for other directories)."""
    truncate_dim: int | None = None
    """config_sentence_transformers.json's truncate_dim: sentence-transformers cuts every vector to it."""
    prompt: str = ""
    """The text of config_sentence_transformers.json's default prompt (`default_prompt_name`), which
    `SentenceTransformer.encode` puts before every text not given a prompt of its own; "" where none is named."""
    lower_case: bool = False
    """sentence_bert_config.json's do_lower_case: texts are lower-cased (a lower-casing normaliser before the
    tokenizer's own), a cased vocabulary's model included."""
    unsupported: str = ""
    """Why bertdist cannot compute this directory's own vectors (a Dense module, max pooling), or "". Asked only
    where those vectors are wanted (`embed` with the directory's pooling, an ONNX sentence encoder): the length
    and the encoder's layers serve `attention`, token features and retrieval all the same."""

    def text(self, text: str, prompted: bool = True) -> str:
        """`text` as `SentenceTransformer(DIR).encode` gives it to the tokenizer: its default prompt before it
        (`prompted`: the first text of a pair only), lower-cased where the directory says so (prompt included)."""
        text = self.prompt + text if prompted else text
        return text.lower() if self.lower_case else text

    def own_vectors(self) -> None:
        """CheckpointFormatError when bertdist cannot compute this directory's own vectors."""
        if self.unsupported:
            raise CheckpointFormatError(self.unsupported)


_KNOWN_MODULES = {"Transformer", "Pooling", "Normalize"}


def read_sentence_pipeline(directory: str | os.PathLike) -> SentencePipeline | None:
    """The pipeline of a sentence-transformers directory, or None where `directory` is not one. A module or a
    pooling mode bertdist does not compute (Dense, max pooling, ...) is named in `unsupported`: vectors without
    it would not be the model's."""
    directory = Path(directory)
    modules = _read_json(directory / "modules.json")
    unsupported = ""
    if modules is None:
        pooling_dir = "1_Pooling"  # an older directory without modules.json
        normalize = False
    else:
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise CheckpointFormatError(f"{directory / 'modules.json'}: not a list of modules")
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        unknown = [kind for kind in kinds if kind not in _KNOWN_MODULES]
        if unknown:
            unsupported = (
                f"{directory / 'modules.json'}: module {unknown[0]} is not supported yet (bertdist computes "
                "Transformer, Pooling and Normalize); its vectors would not be the model's"
            )
        paths = [str(m.get("path", "")) for m, kind in zip(modules, kinds) if kind == "Pooling"]
        pooling_dir, normalize = (paths[0] if paths else ""), "Normalize" in kinds
    config = _read_json(directory / pooling_dir / "config.json") if pooling_dir else None
    if config is None:
        return None
    pooling = _pooling_mode(config)
    if pooling not in ("mean", "cls") and not unsupported:
        unsupported = (
            f"{directory / pooling_dir / 'config.json'}: pooling {pooling or 'none'} is not supported yet "
            "(bertdist pools by mean or cls)"
        )
    dims, truncate_dim, prompt = _read_model_config(directory / "config_sentence_transformers.json")
    if prompt and config.get("include_prompt") is False and not unsupported:
        unsupported = (
            f"{directory / pooling_dir / 'config.json'}: include_prompt false (pooling that leaves out the default "
            "prompt's tokens) is not supported yet"
        )
    return SentencePipeline(
        pooling,
        normalize,
        _read_max_seq_length(directory),
        dims,
        truncate_dim,
        prompt,
        _read_lower_case(directory),
        unsupported,
    )


def _read_model_config(path: Path) -> tuple[tuple[int, ...], int | None, str]:
    """(matryoshka_dims, truncate_dim, the default prompt's text) of a config_sentence_transformers.json; checked,
    as each changes the vectors."""
    config = _read_json(path)
    if not isinstance(config, dict):
        return (), None, ""
    prompts, name = config.get("prompts") or {}, config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointFormatError(f"{path}: prompts must map names to texts, got {prompts!r}")
    if name is not None and name not in prompts:
        raise CheckpointFormatError(f"{path}: default_prompt_name {name!r} is not one of the prompts {list(prompts)}")
    dims, truncate_dim = config.get("matryoshka_dims") or [], config.get("truncate_dim")
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise CheckpointFormatError(f"{path}: matryoshka_dims must be a list of positive integers, got {dims!r}")
    if truncate_dim is not None and (
        isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim <= 0
    ):
        raise CheckpointFormatError(f"{path}: truncate_dim must be a positive integer, got {truncate_dim!r}")
    return tuple(dims), truncate_dim, prompts[name] if name is not None else ""


def _read_lower_case(directory: Path) -> bool:
    config = _read_json(directory / "sentence_bert_config.json")
    lower = config.get("do_lower_case", False) if isinstance(config, dict) else False
    if not isinstance(lower, bool):
        raise CheckpointFormatError(f"{directory / 'sentence_bert_config.json'}: do_lower_case must be true or false")
    return lower


def _pooling_mode(config: Any) -> str:
    """mean, cls, or what else the Pooling config names: sentence-transformers 5 writes `pooling_mode: "mean"`,
    earlier versions (and bertdist's own directories) one `pooling_mode_<mode>_token(s)` flag per mode."""
    if not isinstance(config, dict):
        return ""
    mode = config.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [repr(mode)]
    else:
        modes = [k[len("pooling_mode_") :] for k, on in config.items() if k.startswith("pooling_mode_") and on is True]
    names = [{"cls_token": "cls", "mean_tokens": "mean"}.get(str(m), str(m)) for m in modes]
    return "+".join(names)


def read_pooling(directory: str | os.PathLike) -> str | None:
    """The pooling of a sentence-transformers directory (mean or cls), or None where `directory` is not one."""
    pipeline = read_sentence_pipeline(directory)
    return None if pipeline is None else chosen_pooling(pipeline, "", "")


def chosen_pooling(pipeline: SentencePipeline | None, asked: str, default: str) -> str:
    """`asked` where given; else a sentence-transformers directory's own pooling (its own vectors are then what is
    asked for, so every module of its pipeline must be one bertdist computes: CheckpointFormatError otherwise),
    else `default`. A CLS-trained model read or fine-tuned with mean pooling gives vectors it was never trained to
    produce."""
    if asked:
        return asked
    if pipeline is None:
        return default
    pipeline.own_vectors()
    return pipeline.pooling


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{path}: unreadable ({e})") from None


def _read_max_seq_length(directory: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length; sentence-transformers 6 writes none there and cuts at the
    tokenizer's model_max_length (tokenizer_config.json) instead. None where neither sets one (transformers
    writes a huge number for "no limit")."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        config = _read_json(directory / name)
        length = config.get(key) if isinstance(config, dict) else None
        if length is None:
            continue
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise CheckpointFormatError(f"{directory / name}: {key} must be a positive integer, got {length!r}")
        return length if length < 1 << 30 else None
    return None


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
