"""Which transformers auto class builds a model directory's config.

Vision-language families (a `vision_config` beside the text one) are image-text-to-text models:
`AutoModelForCausalLM` has no entry for them. Everything else trained here is a causal LM.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from hybrid.model_families import is_vision


def auto_model_class(config: Any) -> Any:
    """The auto class whose `from_config` / `from_pretrained` builds `config`'s model."""
    return AutoModelForImageTextToText if is_vision(config) else AutoModelForCausalLM
