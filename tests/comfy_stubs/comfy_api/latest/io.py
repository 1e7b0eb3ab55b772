"""TEST DOUBLE of comfy_api.latest.io: schema records with the attribute names ComfyUI uses
(`id`, `io_type`, `optional`, `tooltip`, `default`, `min`, `max`, `options`). Not ComfyUI code."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"


class _Input:
    io_type = None
    widget = False

    def __init__(self, id, display_name=None, optional=False, tooltip=None, default=None, min=None, max=None,
                 step=None, options=None, **extra):
        self.id, self.display_name, self.optional, self.tooltip = id, display_name, optional, tooltip
        self.default, self.min, self.max, self.step, self.options = default, min, max, step, options
        self.extra = extra


class _Output:
    io_type = None

    def __init__(self, id=None, display_name=None, tooltip=None, is_output_list=False, **extra):
        self.id, self.display_name, self.tooltip = id, display_name, tooltip


def _make(io_type: str, widget: bool):
    inp = type("Input", (_Input,), {"io_type": io_type, "widget": widget})
    out = type("Output", (_Output,), {"io_type": io_type})
    return type(io_type, (), {"Input": inp, "Output": out, "io_type": io_type})


Int = _make("INT", True)
Float = _make("FLOAT", True)
Boolean = _make("BOOLEAN", True)
String = _make("STRING", True)
Combo = _make("COMBO", True)
Image = _make("IMAGE", False)
Latent = _make("LATENT", False)
Vae = _make("VAE", False)
Model = _make("MODEL", False)


def Custom(io_type: str):
    return _make(io_type, False)


@dataclass
class Schema:
    node_id: str
    display_name: Optional[str] = None
    category: str = "sd"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    description: str = ""
    is_output_node: bool = False
    is_experimental: bool = False
    is_deprecated: bool = False
    not_idempotent: bool = False


class NodeOutput:
    def __init__(self, *args: Any, ui=None, expand=None, block_execution=None):
        self.args = args
        self.ui = ui

    @property
    def result(self):
        return self.args if self.args else None


class ComfyNode:
    hidden = None

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls) -> Schema:
        return cls.define_schema()
