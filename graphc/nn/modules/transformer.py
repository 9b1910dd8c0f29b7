"""Attention and transformer layers: `MultiheadAttention`, `TransformerEncoderLayer`,
`TransformerEncoder`, `TransformerDecoderLayer`, `TransformerDecoder`, `Transformer`.

As torch.nn: the same constructor arguments and defaults, the same parameter names
(`in_proj_weight`, `in_proj_bias`, `out_proj.weight`, `self_attn.*`, `linear1`, `norm1`, ...)
so state_dicts interchange, the same mask conventions (a bool `attn_mask` or
`key_padding_mask` marks what may NOT be attended, a float one is added to the scores), and
(L, N, E) inputs unless `batch_first`. Everything is a decomposition into graphc ops
(linear, matmul, softmax, masked_fill, layer_norm), so it traces and compiles.

A query whose every key is masked gives NaN in its output row and its weights with
need_weights=True (a plain softmax, as PyTorch's), 0 with need_weights=False (PyTorch's
scaled_dot_product_attention). Bad input gets PyTorch's exception types (its
`_mha_shape_check` and other refusals are AssertionErrors: `InputCheckError`).

Not matched: PyTorch's inference "fast path" (nested tensors, fused kernels; eval mode, no
grad, self-attention, batch_first, ...) is a speed path, and the results here are those of
the ordinary path, except that its fully masked rows are NaN with need_weights=False too
(here 0) and its errors for bad masks differ from the ordinary path's (here those).
`enable_nested_tensor=True` is ignored.

>>> import graphc
>>> import graphc.nn as nn
>>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
>>> x = graphc.randn(3, 5, 8)
>>> out, weights = mha(x, x, x)
>>> out.shape, weights.shape
(graphc.Size([3, 5, 8]), graphc.Size([3, 5, 5]))
"""

from __future__ import annotations

import copy
import math

import graphc
from graphc.errors import ArgumentError, InputCheckError, ShapeError, where
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.modules.container import ModuleList
from graphc.nn.modules.linear import Linear
from graphc.nn.modules.misc import Dropout
from graphc.nn.modules.normalization import LayerNorm
from graphc.nn.parameter import Parameter


def _factory(dtype) -> dict:
    return {"dtype": dtype} if dtype is not None else {}


def _float_mask(mask, dtype):
    """PyTorch's `_canonical_mask`: a bool mask becomes 0 / -inf in `dtype` (True = -inf)."""
    if mask is None or mask.dtype.is_floating:
        return mask
    return graphc.zeros(*mask.shape, dtype=dtype).masked_fill(mask, -math.inf)


def _refuse(message: str, advice: str):
    """What nn.MultiheadAttention refuses with AssertionError in PyTorch 2.13: its message,
    where, and what to do."""
    return InputCheckError(f"{where('MultiheadAttention')}: {message}; {advice}")


def _size(shape) -> str:
    """A size as PyTorch's messages print theirs (torch.Size([2, 3]))."""
    return f"graphc.Size({list(shape)})"


def _sne(t, dims: int = 3) -> str:
    """An (N, S, E) tensor's size as PyTorch's message prints it: (S, N, E), its first dims."""
    n, length, e = t.shape
    return _size([length, n, e][:dims])


def _check_mask_dtype(mask, name: str) -> None:
    if mask is not None and mask.dtype is not graphc.bool and not mask.dtype.is_floating:
        raise _refuse(f"only bool and floating types of {name} are supported",
                      f"{name} is {mask.dtype.name}: pass a bool mask (True: not attended) or "
                      "a float one (added to the scores)")


def _check_input_shapes(query, key, value, key_padding_mask, attn_mask,
                        num_heads: int) -> bool:
    """PyTorch's `_mha_shape_check`, its AssertionErrors and their wording: whether the call
    is batched (3-d query) or not (2-d)."""
    if query.ndim not in (2, 3):
        raise _refuse(f"query should be unbatched 2D or batched 3D tensor but received "
                      f"{query.ndim}-D query tensor", "pass (L, E), or (N, L, E) with "
                      "batch_first, (L, N, E) without")
    batched = query.ndim == 3
    kind = "batched (3-D)" if batched else "unbatched (2-D)"
    if key.ndim != query.ndim or value.ndim != query.ndim:
        raise _refuse(f"For {kind} `query`, expected `key` and `value` to be {query.ndim}-D but "
                      f"found {key.ndim}-D and {value.ndim}-D tensors respectively",
                      "give key and value the query's layout")
    kpm_ndim = 2 if batched else 1
    if key_padding_mask is not None and key_padding_mask.ndim != kpm_ndim:
        raise _refuse(f"For {kind} `query`, expected `key_padding_mask` to be `None` or "
                      f"{kpm_ndim}-D but found {key_padding_mask.ndim}-D tensor instead",
                      "pass one row per sequence, (N, S) batched or (S,) unbatched, True at "
                      "the keys to leave out")
    if attn_mask is not None:
        if attn_mask.ndim not in (2, 3):
            raise _refuse(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                          f"but found {attn_mask.ndim}-D tensor instead", "pass an (L, S) mask "
                          "for every sequence and head, or (N*num_heads, L, S)")
        expected = (num_heads, query.shape[0], key.shape[0])
        if not batched and attn_mask.ndim == 3 and tuple(attn_mask.shape) != expected:
            raise _refuse(f"Expected `attn_mask` shape to be {expected} but got "
                          f"{_size(attn_mask.shape)}", "pass (num_heads, L, S) or (L, S)")
    return batched


class MultiheadAttention(Module):
    """Attention over `num_heads` heads of embed_dim // num_heads features each.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights or None).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueError("embed_dim must be divisible by num_heads")
        kw = _factory(dtype)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(graphc.empty(embed_dim, embed_dim, **kw))
            self.k_proj_weight = Parameter(graphc.empty(embed_dim, self.kdim, **kw))
            self.v_proj_weight = Parameter(graphc.empty(embed_dim, self.vdim, **kw))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(graphc.empty(3 * embed_dim, embed_dim, **kw))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(graphc.empty(3 * embed_dim, **kw))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if add_bias_kv:  # one more key and value, learned, appended to every sequence
            self.bias_k = Parameter(graphc.empty(1, 1, embed_dim, **kw))
            self.bias_v = Parameter(graphc.empty(1, 1, embed_dim, **kw))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn  # one more key and value of zeros, per head
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        _check_mask_dtype(key_padding_mask, "key_padding_mask")
        _check_mask_dtype(attn_mask, "attn_mask")
        batched = _check_input_shapes(query, key, value, key_padding_mask, attn_mask,
                                      self.num_heads)
        if not batched:  # (L, E): one sequence
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        out, weights = self._attend(query, key, value, key_padding_mask, need_weights,
                                    attn_mask, average_attn_weights, is_causal)
        if not batched:
            out = out.squeeze(0)
            weights = weights.squeeze(0) if weights is not None else None
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _project(self, query, key, value):
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal):
        n, length, e = query.shape
        source = key.shape[1]
        if e != self.embed_dim:
            raise _refuse(f"was expecting embedding dimension of {self.embed_dim}, but got {e}",
                          f"the query's last dim is the embed_dim ({self.embed_dim}) the "
                          "module was built with")
        if self._qkv_same_embed_dim and tuple(key.shape) != tuple(value.shape):
            raise _refuse(f"key shape {_sne(key)} does not match value shape {_sne(value)}",
                          "pass key and value of one shape")
        if not self._qkv_same_embed_dim and tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise _refuse(f"key's sequence and batch dims {_sne(key, 2)} do not match value's "
                          f"{_sne(value, 2)}", "pass key and value of one batch and sequence "
                          "length")
        if is_causal and attn_mask is None:
            raise ArgumentError("Need attn_mask if specifying the is_causal hint. You may use "
                                "the Transformer module method `generate_square_subsequent_mask` "
                                "to create this mask.")
        h, d = self.num_heads, self.head_dim
        kpm = _float_mask(key_padding_mask, query.dtype)
        if is_causal and kpm is None and not need_weights:
            mask = None
        else:
            is_causal = False
            mask = _float_mask(attn_mask, query.dtype)
            if mask is not None:
                if mask.ndim == 2 and tuple(mask.shape) != (length, source):
                    raise ShapeError(f"{where('MultiheadAttention')}: The shape of the 2D "
                                     f"attn_mask is {_size(mask.shape)}, but should be "
                                     f"{(length, source)}. (L, S): a row per query, a column "
                                     "per key")
                if mask.ndim == 3:
                    if tuple(mask.shape) != (n * h, length, source):
                        raise ShapeError(f"{where('MultiheadAttention')}: The shape of the 3D "
                                         f"attn_mask is {_size(mask.shape)}, but should be "
                                         f"{(n * h, length, source)}. (N*num_heads, L, S): "
                                         "one (L, S) mask per sequence and head")
                    mask = mask.reshape(n, h, length, source)
            if kpm is not None:
                for dim, (want, got) in enumerate(zip((n, source), kpm.shape)):
                    if want != got:
                        raise _refuse(f"Expected key_padded_mask.shape[{dim}] to be {want}, but "
                                      f"got {got}", "pass an (N, S) key_padding_mask: a row "
                                      "per sequence, a column per key")
                kpm = kpm.reshape(n, 1, 1, source)
                mask = kpm if mask is None else mask + kpm
        q, k, v = self._project(query, key, value)
        extra = 0  # keys appended by add_bias_kv and add_zero_attn
        if self.bias_k is not None:
            k = graphc.cat([k, self.bias_k.expand(n, 1, e)], 1)
            v = graphc.cat([v, self.bias_v.expand(n, 1, e)], 1)
            extra += 1
        if self.add_zero_attn:
            zeros = graphc.zeros(n, 1, e, dtype=k.dtype)
            k, v = graphc.cat([k, zeros], 1), graphc.cat([v, zeros], 1)
            extra += 1
        if extra and mask is not None:  # the appended keys are never masked
            mask = F.pad(mask, (0, extra))
        q = q.reshape(n, length, h, d).transpose(1, 2)
        k = k.reshape(n, source + extra, h, d).transpose(1, 2)
        v = v.reshape(n, source + extra, h, d).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = graphc.matmul(q * math.sqrt(1.0 / d), k.transpose(-2, -1))
            if mask is not None:
                scores = scores + mask
            weights = F.softmax(scores, dim=-1)
            if p > 0.0:
                weights = F.dropout(weights, p)
            out = graphc.matmul(weights, v)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, mask, p, is_causal)
            weights = None
        out = out.transpose(1, 2).reshape(n, length, e)
        return self.out_proj(out), weights


def _activation(activation):
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise ArgumentError(f"activation should be relu/gelu, not {activation}")
    return activation


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block, each with a residual and LayerNorm (after
    the block, or before it with norm_first)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """Self-attention, attention over the encoder's memory, and a feed-forward block, each
    with a residual and LayerNorm."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                               memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


class TransformerEncoder(Module):
    """`num_layers` deep copies of `encoder_layer`, then an optional final norm."""

    def __init__(self, encoder_layer, num_layers: int, norm=None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal) and mask is not None)
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """`num_layers` deep copies of `decoder_layer`, then an optional final norm."""

    def __init__(self, decoder_layer, num_layers: int, norm=None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal) and tgt_mask is not None,
                      memory_is_causal=memory_is_causal)
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """An encoder-decoder transformer (Vaswani et al.), as torch.nn.Transformer."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        options = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                       layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                       norm_first=norm_first, bias=bias, dtype=dtype)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **options), num_encoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **options), num_decoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None):
        """A float (sz, sz) mask: -inf above the diagonal, 0 on and below it."""
        dtype = dtype if dtype is not None else graphc.float32
        return graphc.triu(graphc.full((sz, sz), -math.inf, dtype=dtype), diagonal=1)
