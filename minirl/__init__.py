"""minirl: Agentic RL for Qwen2.5, from scratch in PyTorch. See README.md.

`minirl.generate` and `minirl.stream` sample with every speed-up of minirl/fast/ (what a library
user expects of a generate call); `minirl.sampling.generate` is the plain loop the lessons show,
the same call and the same greedy tokens, slower."""

from .config import Qwen2Config, preset
from .fast import generate, stream
from .model import Qwen2, random_model
from .sampling import Completion
from .tokenizer import Tokenizer
from .weights import load_model, load_pretrained, save_pretrained

__version__ = "0.1.0"
__all__ = [
    "Qwen2Config",
    "preset",
    "Qwen2",
    "random_model",
    "Completion",
    "generate",
    "stream",
    "Tokenizer",
    "load_model",
    "load_pretrained",
    "save_pretrained",
]
