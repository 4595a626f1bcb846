"""Vocabulary bridge between the policy's tokenizer and a reward model's (docs/design.md).

Definitions (all built once per tokenizer pair, then cached):

- **Piece** of policy token v: the bytes v contributes to decoded text. Byte-level BPE
  (GPT-2, Qwen2, Llama-3 style): the token's bytes (possibly a partial UTF-8 character).
  Other tokenizers (WordPiece, SentencePiece): ``decode([a, v])`` minus ``decode([a])`` for a
  fixed anchor token a (so word-initial pieces carry their leading space), with
  SentencePiece byte-fallback tokens ``<0xNN>`` mapped to their byte. Special tokens (and
  LM-head rows beyond the tokenizer) have the empty piece.
- **Text** of a token sequence: the UTF-8 decoding of its concatenated pieces (invalid byte
  sequences dropped). For byte-level BPE and WordPiece this is ``tokenizer.decode`` (with
  special tokens skipped) up to a leading space.
- **Bridged table** E' (V_policy, d): row v is the mean of the RM embeddings of the RM tokens
  that the text of v alone becomes (``rm_tokenizer(text, add_special_tokens=False)``).
  A token whose text is empty or becomes no RM token (special tokens, partial UTF-8 bytes,
  pure whitespace for most RM tokenizers) gets a zero row; these are the *empty* tokens,
  counted by ``n_empty``.
- **Character spans**: a character of the text belongs to the policy token holding its last
  byte (the token that completes it); an empty token owns no characters. RM tokens carry
  their character offsets from the RM tokenizer.
- **Gradient transfer**: RM token k's gradient g_k is shared among the policy tokens whose
  characters it overlaps, in proportion to the number of overlapping characters:
  ``g_policy[j] = sum_k overlap(j, k) / sum_j' overlap(j', k) * g_k``. Every RM token that
  overlaps at least one policy token hands on exactly its gradient (the shares sum to 1):
  gradient mass is conserved. An RM token that overlaps none (its characters all belong to
  empty tokens) is dropped, and counted.

Identical vocabularies (same token -> id map) are detected; ``identical`` is then True and
the reward model can read policy ids directly (E' = E, gradients move position by position).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from credit_core import CreditError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def plain_backend(tokenizer: Any) -> Any:
    """A private copy of ``tokenizer``'s Rust tokenizer with padding and truncation off.

    (The ``transformers`` wrapper switches these on the shared backend object per call, so
    the backend's state depends on the last call; a copy does not.)
    """
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise CreditError(
            f"tokenizer: expected a fast (Rust-backed) tokenizer, got {type(tokenizer).__name__}"
        )
    plain = Tokenizer.from_str(backend.to_str())
    plain.no_padding()
    plain.no_truncation()
    return plain


def _decoder_types(node: Any) -> set[str]:
    if not isinstance(node, dict):
        return set()
    found = {str(node.get("type"))}
    for child in node.get("decoders") or []:
        found |= _decoder_types(child)
    return found


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything that defines how ``tokenizer`` maps text to ids and back."""
    return hashlib.sha1(plain_backend(tokenizer).to_str().encode()).hexdigest()


def token_pieces(tokenizer: Any, vocab_size: int | None = None) -> list[bytes]:
    """The piece (bytes) of every policy id in [0, vocab_size) (see the module docstring)."""
    n_tok = len(tokenizer)
    V = n_tok if vocab_size is None else vocab_size
    backend = plain_backend(tokenizer)
    decoders = _decoder_types(json.loads(backend.to_str()).get("decoder"))
    special = set(tokenizer.all_special_ids)
    added = {i for i in tokenizer.added_tokens_decoder if i not in special}
    ids = list(range(min(V, n_tok)))
    tokens = tokenizer.convert_ids_to_tokens(ids)
    pieces: list[bytes] = []
    if "ByteLevel" in decoders:
        for i, tok in enumerate(tokens):
            if i in special or tok is None:
                pieces.append(b"")
            elif i in added or any(c not in _UNICODE_TO_BYTE for c in tok):
                pieces.append(tok.encode("utf-8"))
            else:
                pieces.append(bytes(_UNICODE_TO_BYTE[c] for c in tok))
    else:
        anchor = backend.encode("a", add_special_tokens=False).ids
        if not anchor:
            raise CreditError("tokenizer: cannot find an anchor token (it encodes 'a' to nothing)")
        a = anchor[0]
        prefix = backend.decode([a], skip_special_tokens=False)
        decoded = backend.decode_batch([[a, i] for i in ids], skip_special_tokens=False)
        fallback = "ByteFallback" in decoders
        for i, (tok, text) in enumerate(zip(tokens, decoded, strict=True)):
            match = _BYTE_FALLBACK.match(tok or "") if fallback else None
            if i in special:
                pieces.append(b"")
            elif match is not None:
                pieces.append(bytes([int(match.group(1), 16)]))
            else:
                piece = text[len(prefix) :] if text.startswith(prefix) else text
                pieces.append(piece.replace("\ufffd", "").encode("utf-8"))
    pieces.extend(b"" for _ in range(V - len(pieces)))
    return pieces


@dataclass(frozen=True)
class SpanBatch:
    """Texts of a batch of policy token rows and each token's character span in its text.

    ``spans`` (B, T, 2) int64: [start, end) in ``texts[b]``; (0, 0) at masked positions and
    for empty tokens.
    """

    texts: list[str]
    spans: torch.Tensor


class VocabBridge:
    """The bridge from a reward model's vocabulary to the policy's (see module docstring).

    Build with ``VocabBridge.build(policy_tokenizer, rm_tokenizer, policy_vocab_size=...)``,
    which caches per (policy tokenizer, RM tokenizer, policy_vocab_size) fingerprint.

    - ``identical``: the two vocabularies are the same (the fast path: no text round trip).
    - ``policy_vocab_size``: rows of E' (the policy LM head's outputs; may exceed the
      tokenizer's size, the extra rows are empty).
    - ``receives`` (V_policy,) bool: tokens with a nonzero row, the only ones that receive
      gradient; ``empty_ids`` the others, ``n_empty`` how many. With identical
      vocabularies nothing is empty except LM-head rows beyond the RM's table.
    """

    def __init__(
        self, policy_tokenizer: Any, rm_tokenizer: Any, *, policy_vocab_size: int | None = None
    ) -> None:
        V = len(policy_tokenizer) if policy_vocab_size is None else int(policy_vocab_size)
        if V < 1:
            raise CreditError(f"policy_vocab_size: expected >= 1, got {V}")
        self.policy_vocab_size = V
        self.rm_vocab_size = len(rm_tokenizer)
        self.identical = policy_tokenizer.get_vocab() == rm_tokenizer.get_vocab()
        self._pieces = np.empty(0, dtype=object)
        self._piece_len = np.zeros(0, dtype=np.int64)
        if self.identical:
            receives = torch.arange(V) < self.rm_vocab_size
            self._rows = self._cols = torch.arange(min(V, self.rm_vocab_size))
            self._weights = torch.ones(self._rows.shape[0], dtype=torch.float64)
        else:
            pieces = token_pieces(policy_tokenizer, V)
            self._pieces = np.empty(V, dtype=object)
            self._pieces[:] = pieces
            self._piece_len = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=V)
            texts = [p.decode("utf-8", errors="ignore") for p in pieces]
            rm_ids = [
                enc.ids
                for enc in plain_backend(rm_tokenizer).encode_batch(texts, add_special_tokens=False)
            ]
            counts = np.fromiter((len(r) for r in rm_ids), dtype=np.int64, count=V)
            flat = [i for r in rm_ids for i in r]
            self._rows = torch.from_numpy(np.repeat(np.arange(V), counts))
            self._cols = torch.tensor(flat, dtype=torch.long)
            self._weights = torch.from_numpy(1.0 / np.repeat(np.maximum(counts, 1), counts))
            receives = torch.from_numpy(counts > 0)
        self.receives: torch.Tensor = receives
        self.empty_ids: torch.Tensor = torch.nonzero(~receives).flatten()
        self.n_empty = int(self.empty_ids.numel())

    _cache: ClassVar[dict[tuple[str, str, int | None], VocabBridge]] = {}

    @classmethod
    def build(
        cls, policy_tokenizer: Any, rm_tokenizer: Any, *, policy_vocab_size: int | None = None
    ) -> VocabBridge:
        """The bridge for this tokenizer pair, built on first use and cached in memory."""
        key = (
            tokenizer_fingerprint(policy_tokenizer),
            tokenizer_fingerprint(rm_tokenizer),
            policy_vocab_size,
        )
        bridge = cls._cache.get(key)
        if bridge is None:
            bridge = cls._cache[key] = cls(
                policy_tokenizer, rm_tokenizer, policy_vocab_size=policy_vocab_size
            )
        return bridge

    def bridged_embedding(self, rm_embedding: torch.Tensor) -> torch.Tensor:
        """E' (V_policy, d) from the RM's table E (V_rm, d): row v = mean of E over v's RM
        tokens, 0 for empty tokens. With identical vocabularies, E itself (plus zero rows
        for LM-head rows beyond it). Differentiable, same dtype and device as E."""
        if rm_embedding.dim() != 2 or rm_embedding.shape[0] < self.rm_vocab_size:
            raise CreditError(
                f"rm_embedding: expected shape (>= {self.rm_vocab_size}, d) (the RM tokenizer's "
                f"vocabulary), got {tuple(rm_embedding.shape)}"
            )
        V = self.policy_vocab_size
        if self.identical and rm_embedding.shape[0] == V:
            return rm_embedding
        dev = rm_embedding.device
        rows, cols = self._rows.to(dev), self._cols.to(dev)
        weights = self._weights.to(device=dev, dtype=rm_embedding.dtype).unsqueeze(1)
        out = rm_embedding.new_zeros(V, rm_embedding.shape[1])
        return out.index_add(0, rows, rm_embedding[cols] * weights)

    def texts(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """The text of each row's masked-in tokens (not for identical vocabularies)."""
        return self.spans(ids, mask).texts

    def spans(self, ids: torch.Tensor, mask: torch.Tensor) -> SpanBatch:
        """Texts and per-token character spans of policy rows ``ids`` (B, T) under ``mask``.

        Vectorized per row (numpy over bytes); a row whose bytes are not valid UTF-8 (for
        example a response cut inside a character) takes a per-token incremental decode.
        """
        if self.identical:
            raise CreditError("VocabBridge.spans: identical vocabularies need no text spans")
        ids_np = ids.detach().cpu().numpy()
        mask_np = mask.detach().cpu().numpy().astype(bool)
        real = ids_np[mask_np]
        if real.size and (real.min() < 0 or real.max() >= self.policy_vocab_size):
            raise CreditError(
                f"ids: expected policy token ids in [0, {self.policy_vocab_size}) where the "
                "mask is set"
            )
        receives = self.receives.numpy()
        spans = np.zeros((*ids_np.shape, 2), dtype=np.int64)
        texts = []
        for b in range(ids_np.shape[0]):
            row = ids_np[b][mask_np[b]]
            pieces = self._pieces[row]
            data = b"".join(pieces)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text, start, end = _spans_incremental(pieces)
            else:
                start, end = _spans_valid_utf8(data, self._piece_len[row])
            keep = receives[row]
            spans[b, mask_np[b], 0] = np.where(keep, start, 0)
            spans[b, mask_np[b], 1] = np.where(keep, end, 0)
            texts.append(text)
        return SpanBatch(texts=texts, spans=torch.from_numpy(spans).to(ids.device))

    @staticmethod
    def move_gradients(
        rm_grad: torch.Tensor,
        rm_spans: torch.Tensor,
        rm_valid: torch.Tensor,
        policy_spans: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Share RM-token gradients among policy tokens by character overlap.

        - rm_grad (B, K, d): gradient at each RM response token; rm_spans (B, K, 2) their
          character spans; rm_valid (B, K) bool the real ones.
        - policy_spans (B, R, 2): character spans of the policy response tokens (empty for
          padding and empty tokens).
        Returns (policy_grad (B, R, d), dropped (B, K) bool: valid RM tokens that overlap
        no policy token, whose gradient is lost). Column-stochastic sharing: for every kept
        RM token the shares sum to 1, so sum_j policy_grad[b, j] = sum_{k kept} rm_grad[b, k].
        """
        B, K, d = rm_grad.shape
        R = policy_spans.shape[1]
        out = rm_grad.new_zeros(B, R, d)
        dropped = torch.zeros(B, K, dtype=torch.bool, device=rm_grad.device)
        ps, pe = policy_spans[..., 0], policy_spans[..., 1]
        rs, re_ = rm_spans[..., 0], rm_spans[..., 1]
        for b in range(B):
            overlap = torch.minimum(pe[b, :, None], re_[b, None, :]) - torch.maximum(
                ps[b, :, None], rs[b, None, :]
            )
            overlap = overlap.clamp(min=0).to(rm_grad.dtype) * rm_valid[b, None, :]
            total = overlap.sum(dim=0)
            dropped[b] = rm_valid[b] & (total == 0)
            share = overlap / torch.where(total > 0, total, 1.0)
            out[b] = share @ rm_grad[b]
        return out, dropped


def _spans_valid_utf8(data: bytes, piece_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Character spans of pieces whose concatenation ``data`` is valid UTF-8 (vectorized)."""
    u = np.frombuffer(data, dtype=np.uint8)
    is_last = np.ones(u.shape[0], dtype=bool)
    is_last[:-1] = (u[1:] & 0xC0) != 0x80
    completed = np.concatenate([[0], np.cumsum(is_last)])
    byte_end = np.cumsum(piece_len)
    return completed[byte_end - piece_len], completed[byte_end]


def _spans_incremental(pieces: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """Text and character spans when the bytes are not valid UTF-8 (invalid bytes dropped)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
    parts, start, end = [], np.zeros(len(pieces), np.int64), np.zeros(len(pieces), np.int64)
    pos = 0
    for i, piece in enumerate(pieces):
        chunk = decoder.decode(piece)
        parts.append(chunk)
        start[i], pos = pos, pos + len(chunk)
        end[i] = pos
    return "".join(parts), start, end
