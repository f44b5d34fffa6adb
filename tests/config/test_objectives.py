"""model.objective's table (bertdist.config.objectives): the Hugging Face record, and configs saved by runs
from before the objective had a name."""

from __future__ import annotations

from bertdist.config import ModelConfig
from bertdist.config.choices import choices
from bertdist.config.objectives import HF_KEY, OBJECTIVES, objective_from_hf, upgrade_model_section


def test_every_objective_of_the_schema_has_a_row_in_the_schemas_order():
    assert tuple(OBJECTIVES) == choices(ModelConfig, "objective")


def test_a_config_json_names_the_objective_by_its_class_and_its_record():
    assert objective_from_hf({"architectures": ["BertForMaskedLM"], HF_KEY: "mlm+sop"}, "mlm+nsp") == "mlm"
    assert objective_from_hf({"architectures": ["BertForPreTraining"], HF_KEY: "mlm+sop"}, "mlm+nsp") == "mlm+sop"
    assert objective_from_hf({"architectures": ["BertForPreTraining"]}, "mlm+nsp") == "mlm+nsp"  # transformers'
    assert objective_from_hf({"architectures": ["AlbertForPreTraining"], HF_KEY: "mlm"}, "mlm+sop") == "mlm+sop"


def test_a_run_saved_with_next_sentence_prediction_reads_as_its_objective():
    assert upgrade_model_section({"size": "tiny", "next_sentence_prediction": False}) == {
        "size": "tiny",
        "objective": "mlm",
    }
    assert upgrade_model_section({"next_sentence_prediction": True})["objective"] == "mlm+nsp"
    assert upgrade_model_section({"objective": "mlm+sop"}) == {"objective": "mlm+sop"}
