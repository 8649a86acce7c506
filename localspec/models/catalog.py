"""The model catalog as data: families that share a tokenizer, their targets and drafts,
each quantization's size and where its file comes from, and the named pairs.

Frozen dataclasses and lookups only; `catalog_file` reads them from models.toml, and
`resolve` finds which of them are installed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from localspec.errors import LocalspecError
from localspec.models.mirror import PypiChunks

# Quantizations from smallest to largest: a larger one keeps more of the model's quality.
QUANT_ORDER = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")
DEFAULT_QUANT = "Q4_K_M"
ROLES = ("target", "draft")


class UnknownModel(LocalspecError):
    """A model, pair or family id that the catalog does not have."""


@dataclass(frozen=True)
class Recurrent:
    """A hybrid model's recurrent layers (Qwen3.5's Gated DeltaNet, its config's
    `linear_*`; llama.cpp's `ssm.*` keys in brackets): what sizes the state each keeps
    per sequence, before the file is here to say (memory.Weights.estimate)."""

    key_heads: int  # linear_num_key_heads (ssm.group_count)
    value_heads: int  # linear_num_value_heads (ssm.time_step_rank)
    head_dim: int  # linear_key_head_dim = linear_value_head_dim (ssm.state_size)
    conv_kernel: int  # linear_conv_kernel_dim (ssm.conv_kernel)


@dataclass(frozen=True)
class Shape:
    """The numbers the memory estimate needs (from the model's config)."""

    layers: int
    kv_heads: int
    head_dim: int
    embedding: int
    vocab: int
    context: int  # training context, tokens
    tied_embeddings: bool = False  # the output head reuses the token embeddings
    # a hybrid model's one attention layer in this many (the others keep a recurrent
    # state of a fixed size, not a KV cache); 1: every layer attends
    attention_every: int = 1
    recurrent: Recurrent | None = None  # what sizes that state (None: not known)

    @property
    def kv_layers(self) -> int:
        return self.layers // self.attention_every

    def kv_bytes_per_token(self, element_bytes: int = 2) -> int:
        """K and V for every attention layer: 2 x layers x KV heads x head size x size."""
        return 2 * self.kv_layers * self.kv_heads * self.head_dim * element_bytes


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts model's routed experts (per layer)."""

    experts: int
    active: int  # used by each token
    expert_ff: int  # an expert's feed-forward width
    shared: bool = False  # a shared expert every token uses (counted as dense weights)

    def expert_params(self, embedding: int) -> int:
        """One layer's routed expert weights: gate, up and down of each expert."""
        return 3 * self.expert_ff * embedding * self.experts


@dataclass(frozen=True)
class HubFile:
    """A file on the Hugging Face hub; `file` may be a glob (split GGUFs -0000i-of-0000N)."""

    repo: str
    file: str
    revision: str = "main"

    @property
    def is_glob(self) -> bool:
        return any(c in self.file for c in "*?[")

    @property
    def uri(self) -> str:
        return f"hf://{self.repo}/{self.file}"


@dataclass(frozen=True)
class Mirror:
    """A file published as PyPI chunk packages (see mirror.py), for machines without the
    hub. Its sha256 is that of the assembled file."""

    id: str
    chunks: PypiChunks
    file: str  # the assembled file's name
    size: int
    sha256: str


@dataclass(frozen=True)
class Quant:
    """One quantization of a model: its size and where its file comes from."""

    name: str  # "Q4_K_M"
    size: int  # bytes, all shards together
    hub: HubFile | None
    mirror: Mirror | None = None
    sha256: str | None = None  # of the (single-file) GGUF, whatever the source

    @property
    def rank(self) -> int:
        """Position in QUANT_ORDER: higher keeps more quality (unknown names last)."""
        return QUANT_ORDER.index(self.name) if self.name in QUANT_ORDER else len(QUANT_ORDER)


@dataclass(frozen=True)
class ModelEntry:
    """A model as the catalog lists it (not a loaded one: that is backends.base.Model)."""

    id: str
    name: str
    family: str
    role: str  # "target" | "draft"
    params: float  # billions
    shape: Shape
    quants: tuple[Quant, ...]
    drafts: tuple[str, ...] = ()  # a target's drafts; empty = every draft of its family
    completes_code: bool = False  # trained to fill in the middle (serve's /infill)
    moe: Moe | None = None  # routed experts, for a mixture-of-experts model
    mtp_layers: int = 0  # MTP heads its GGUF carries (the target drafts with its own)
    architecture: str | None = None  # GGUF architecture, where not its family's

    def quant(self, name: str | None = None) -> Quant:
        """The named quantization, or the default one (Q4_K_M, else the smallest)."""
        wanted = (name or DEFAULT_QUANT).upper()
        for q in self.quants:
            if q.name == wanted:
                return q
        if name is None:
            return min(self.quants, key=lambda q: q.size)
        have = ", ".join(q.name for q in self.quants)
        raise UnknownModel(f"{self.id} has no {wanted} quantization (it has {have})")


@dataclass(frozen=True)
class Family:
    """Models that share a tokenizer, so any of its drafts can draft for its targets."""

    id: str
    name: str
    architecture: str  # GGUF general.architecture
    tokenizer: str  # families with the same label share a vocabulary


@dataclass(frozen=True)
class PairEntry:
    """A named target + draft in the catalog, pulled together (`localspec pull default`)."""

    id: str
    target: str
    draft: str
    quant: str = DEFAULT_QUANT


@dataclass(frozen=True)
class Catalog:
    """Everything models.toml lists; `default_family` is what a plan uses unless asked."""

    families: tuple[Family, ...]
    models: tuple[ModelEntry, ...]
    pairs: tuple[PairEntry, ...]
    default_family: str

    def model(self, model_id: str) -> ModelEntry:
        """The model with this id; a one-line error with close matches otherwise."""
        for m in self.models:
            if m.id == model_id:
                return m
        raise UnknownModel(f"no model '{model_id}' in the catalog{suggest(model_id, self.ids())}")

    def find(self, model_id: str) -> ModelEntry | None:
        return next((m for m in self.models if m.id == model_id), None)

    def family(self, family_id: str) -> Family:
        for f in self.families:
            if f.id == family_id:
                return f
        names = [f.id for f in self.families]
        raise UnknownModel(f"no family '{family_id}' (families: {', '.join(names)})")

    def pair(self, pair_id: str) -> PairEntry | None:
        return next((p for p in self.pairs if p.id == pair_id), None)

    def ids(self) -> list[str]:
        return [m.id for m in self.models] + [p.id for p in self.pairs]

    def targets(self, family: str | None = None) -> list[ModelEntry]:
        """Targets (of one family, or all), smallest first."""
        found = [m for m in self.models if m.role == "target" and family in (None, m.family)]
        return sorted(found, key=lambda m: m.params)

    def drafts_for(self, target: ModelEntry) -> list[ModelEntry]:
        """The drafts that pair with `target`, largest first (they accept more)."""
        if target.drafts:
            found = [self.model(d) for d in target.drafts]
        else:
            found = [m for m in self.models if m.role == "draft" and m.family == target.family]
        return sorted(found, key=lambda m: -m.params)

    def tokenizer_of(self, model: ModelEntry) -> str:
        return self.family(model.family).tokenizer


def split_spec(spec: str) -> tuple[str, str | None]:
    """'id' or 'id:Q8_0' -> (id, quant)."""
    model_id, _, quant = spec.partition(":")
    return model_id.strip().lower(), (quant.strip().upper() or None)


def suggest(word: str, choices: list[str]) -> str:
    """' (did you mean a, b?)' for the close matches of `word`, else ''."""
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""
