"""The density model and its checkpoints.

:class:`DensityNet` maps one sample's features (channels, nely, nelx) (see
:data:`sphyr_jax.training.problems.CHANNELS`) to logits (nely, nelx) — or, with
``ndim=3``, voxel features (channels, nz, ny, nx) to logits (nz, ny, nx) by 3D
convolutions; a sigmoid
turns them into densities, which callers use only on design cells.  By default
it is exactly equivariant to the symmetries of the problem: every input is
turned so its load points down (the canonical frame of the SPhyR generators),
the conv net sees it and its left-right mirror image, and the averaged logits
are turned back — so a grid turned or mirrored with its load direction gets
the turned or mirrored completion, and the net only has to learn one
orientation.  Checkpoints
are the model's leaves (``eqx.tree_serialise_leaves``) plus its architecture as
JSON, so a model loads without the training configuration.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp

from sphyr_jax.problem.symmetry import turn_planes, turn_vector
from sphyr_jax.training.config import ModelConfig, model_config_from_dict
from sphyr_jax.training.problems import CHANNELS, channels

_G_ROW, _G_COL = CHANNELS.index("gravity_row"), CHANNELS.index("gravity_col")

WEIGHTS_FILE = "model.eqx"
CONFIG_FILE = "model.json"


class DensityNet(eqx.Module):
    """Residual dilated conv net with global context: features -> logits.

    Each block adds ``conv_d(gelu(h + W mean(h)))`` to the hidden state: the
    dilations give a receptive field spanning the grid (load at the top,
    supports at the bottom), the global mean lets every cell see e.g. the
    length of the load.  The 1x1 head starts at zero weights and the bias of
    ``init_density``, so every design cell starts at that density.
    """

    stem: eqx.nn.Conv
    blocks: tuple
    mixers: tuple
    head: eqx.nn.Conv
    canonical: bool = eqx.field(static=True, default=True)
    mirror_average: bool = eqx.field(static=True, default=True)

    def __init__(self, config: ModelConfig, key):
        self.canonical = config.canonical and config.ndim == 2
        self.mirror_average = config.mirror_average
        n = len(config.dilations)
        keys = jax.random.split(key, 2 * n + 2)
        w = config.width
        conv = eqx.nn.Conv2d if config.ndim == 2 else eqx.nn.Conv3d
        self.stem = conv(len(channels(config.ndim)), w, 3, padding=1, key=keys[0])
        self.blocks = tuple(conv(w, w, 3, padding=d, dilation=d, key=keys[1 + i])
                            for i, d in enumerate(config.dilations))
        self.mixers = tuple(eqx.nn.Linear(w, w, key=keys[1 + n + i]) for i in range(n))
        p = config.init_density
        head = conv(w, 1, 1, key=keys[-1])
        self.head = eqx.tree_at(lambda h: (h.weight, h.bias), head,
                                (jnp.zeros_like(head.weight),
                                 jnp.full_like(head.bias, math.log(p / (1.0 - p)))))

    def net(self, features: jax.Array) -> jax.Array:
        """Logits (*cells) of the bare conv net (no symmetrisation) of (C, *cells)."""
        h = self.stem(features)
        spatial = tuple(range(1, h.ndim))
        for conv, mix in zip(self.blocks, self.mixers, strict=True):
            g = mix(jnp.mean(h, axis=spatial))
            h = h + conv(jax.nn.gelu(h + g.reshape(g.shape + (1,) * len(spatial))))
        return self.head(jax.nn.gelu(h))[0]

    def __call__(self, features: jax.Array) -> jax.Array:
        """Logits (nely, nelx) of one sample's features (C, nely, nelx).

        With ``canonical``, the input is turned by -k quarter turns, k the turn
        taking down to the axis direction nearest the load direction (on a
        non-square grid only half turns: up -> down), its gravity channels set
        to the turned direction, and the logits turned back by k.  With
        ``mirror_average`` the logits of the (turned) input and of its
        left-right mirror (gravity column negated) are averaged.  Voxel
        features (C, nz, ny, nx) are only mirrored (their load points down).
        """
        x = features
        if x.ndim == 4:
            z = self.net(x)
            if self.mirror_average:
                xm = jnp.flip(x, axis=-1).at[-1].multiply(-1.0)  # gravity_col is last
                z = 0.5 * (z + jnp.flip(self.net(xm), axis=-1))
            return z
        g = jnp.stack([features[_G_ROW, 0, 0], features[_G_COL, 0, 0]])
        k = jnp.asarray(0)
        if self.canonical:
            if x.shape[-1] == x.shape[-2]:
                k = jnp.argmax(jnp.stack([g[0], g[1], -g[0], -g[1]]))
            else:
                k = jnp.where(g[0] < 0, 2, 0)
            x = turn_planes(x, -k)
            g = turn_vector(g, -k)
            x = x.at[_G_ROW].set(g[0]).at[_G_COL].set(g[1])
        z = self.net(x)
        if self.mirror_average:
            xm = jnp.flip(x, axis=-1).at[_G_COL].set(-g[1])
            z = 0.5 * (z + jnp.flip(self.net(xm), axis=-1))
        return turn_planes(z, k) if self.canonical else z


def init_model(config: ModelConfig, key) -> DensityNet:
    """A float64 :class:`DensityNet` initialised from a PRNG key (or an int seed)."""
    if isinstance(key, int):
        key = jax.random.PRNGKey(key)
    model = DensityNet(config, key)
    return jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, model)


def predict(model: DensityNet, features: jax.Array, sharpness=1.0, leak=0.0) -> jax.Array:
    """Densities sigmoid(sharpness * logits) of a batch, (B, *cells).

    Args:
        model: the density model.
        features: (B, C, *cells).
        sharpness: logit scale (1 at inference).
        leak: added to the derivative with respect to the scaled logits
            without changing the value (keeps saturated cells trainable).
    """
    z = sharpness * jax.vmap(model)(features)
    return jax.nn.sigmoid(z) + leak * (z - jax.lax.stop_gradient(z))


def save_checkpoint(directory, model: DensityNet, config: ModelConfig) -> pathlib.Path:
    """Write ``model.eqx`` (leaves) and ``model.json`` (architecture); returns the weights path."""
    from sphyr_jax.io import atomic_write_json

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WEIGHTS_FILE
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    eqx.tree_serialise_leaves(tmp, model)
    tmp.replace(path)
    atomic_write_json(directory / CONFIG_FILE, dataclasses.asdict(config))
    return path


def load_checkpoint(directory) -> DensityNet:
    """Read a model written by :func:`save_checkpoint`."""
    directory = pathlib.Path(directory)
    config = model_config_from_dict(json.loads((directory / CONFIG_FILE).read_text()))
    skeleton = init_model(config, 0)
    return eqx.tree_deserialise_leaves(directory / WEIGHTS_FILE, skeleton)
