"""The density model and its checkpoints.

:class:`DensityNet` maps one sample's features (channels, nely, nelx) (see
:data:`sphyr_jax.training.problems.CHANNELS`) to logits (nely, nelx) — or, with
``ndim=3``, voxel features (channels, nz, ny, nx) to logits (nz, ny, nx) by 3D
convolutions; a sigmoid
turns them into densities, which callers use only on design cells.  By default
it is exactly equivariant to the eight symmetries of the square: every input
is turned or mirrored so its load points down (an axis direction: the
canonical frame of the SPhyR generators) or down-right (a diagonal), the conv
net sees it and its image under the reflection that keeps that direction (the
left-right mirror, or the transpose), and the averaged logits are taken back,
so a grid turned or mirrored with its load direction gets the turned or
mirrored completion and the net only has to learn two orientations.  Checkpoints
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

from sphyr_jax.problem.symmetry import (
    canonical_element,
    inverse_element,
    stabiliser,
    transform_planes,
    transform_vector,
)
from sphyr_jax.training.config import ModelConfig, model_config_from_dict
from sphyr_jax.training.problems import CHANNELS, channels, energy_field, feature_gravity

_G_ROW, _G_COL = CHANNELS.index("gravity_row"), CHANNELS.index("gravity_col")

WEIGHTS_FILE = "model.eqx"
CONFIG_FILE = "model.json"
PRETRAINED = ("physics",)
"""Built-in checkpoints shipped in the package (``sphyr_jax/training/pretrained/<name>``)."""


class DensityNet(eqx.Module):
    """Residual dilated conv net with global context: features -> logits.

    Each block adds ``conv_d(gelu(h + W mean(h)))`` to the hidden state: the
    dilations give a receptive field spanning the grid (load at the top,
    supports at the bottom), the global mean lets every cell see e.g. the
    length of the load.  The 1x1 head starts at zero weights and the bias of
    ``init_density``, so every design cell starts at that density.
    ``binary_hard``: hard subjects are written ``0.0``/``1.0``
    (``ModelConfig.hard_values``).
    """

    stem: eqx.nn.Conv
    blocks: tuple
    mixers: tuple
    head: eqx.nn.Conv
    canonical: bool = eqx.field(static=True, default=True)
    mirror_average: bool = eqx.field(static=True, default=True)
    binary_hard: bool = eqx.field(static=True, default=False)
    energy_channel: bool = eqx.field(static=True, default=False)

    def __init__(self, config: ModelConfig, key):
        self.canonical = config.canonical and config.ndim == 2
        self.mirror_average = config.mirror_average
        self.binary_hard = config.hard_values == "binary"
        self.energy_channel = config.energy_channel
        n = len(config.dilations)
        keys = jax.random.split(key, 2 * n + 2)
        w = config.width
        conv = eqx.nn.Conv2d if config.ndim == 2 else eqx.nn.Conv3d
        inputs = len(channels(config.ndim)) + int(config.energy_channel)
        self.stem = conv(inputs, w, 3, padding=1, key=keys[0])
        self.blocks = tuple(conv(w, w, 3, padding=d, dilation=d, key=keys[1 + i])
                            for i, d in enumerate(config.dilations))
        self.mixers = tuple(eqx.nn.Linear(w, w, key=keys[1 + n + i]) for i in range(n))
        p = config.init_density
        head = conv(w, 1, 1, key=keys[-1])
        self.head = eqx.tree_at(lambda h: (h.weight, h.bias), head,
                                (jnp.zeros_like(head.weight),
                                 jnp.full_like(head.bias, math.log(p / (1.0 - p)))))

    def net(self, features: jax.Array) -> jax.Array:
        """Logits (*cells) of the bare conv net (no symmetrisation) of (C, *cells).

        With ``energy_channel`` the finite elements' reading of the input
        (:func:`~sphyr_jax.training.problems.energy_field`) is appended to
        its channels first.
        """
        if self.energy_channel:
            features = jnp.concatenate([features, energy_field(features)[None]])
        h = self.stem(features)
        spatial = tuple(range(1, h.ndim))
        ones = (1,) * len(spatial)
        for conv, mix in zip(self.blocks, self.mixers, strict=True):
            # W mean(h) + b, written on the (w, 1, ..) kept-dims mean: XLA's CPU
            # compiler has been seen to get the plain form wrong once it is
            # batched large (e.g. 96 grids of 20x20, width 48).
            g = jnp.einsum("c...,dc->d...", jnp.mean(h, axis=spatial, keepdims=True),
                           mix.weight) + mix.bias.reshape(mix.bias.shape + ones)
            h = h + conv(jax.nn.gelu(h + g))
        return self.head(jax.nn.gelu(h))[0]

    def __call__(self, features: jax.Array) -> jax.Array:
        """Logits (nely, nelx) of one sample's features (C, nely, nelx).

        With ``canonical``, the input is taken by the symmetry of
        :func:`~sphyr_jax.problem.symmetry.canonical_element` into the
        canonical frame (an axis load direction points down, a diagonal one
        down-right; on a non-square grid only half turns and mirrors are
        used), its gravity channels set to the canonical direction, and the
        logits taken back.  With ``mirror_average`` the logits are averaged
        over the stabiliser of the (canonical) direction
        (:func:`~sphyr_jax.problem.symmetry.stabiliser`): with the load down,
        the input and its left-right mirror; down-right, the input and its
        transpose.  Both together make the model exactly equivariant under the
        eight symmetries of the square: a grid turned or mirrored with its load
        direction gets the turned or mirrored logits, bit for bit.  Without
        ``canonical``, ``mirror_average`` averages the input with its
        left-right mirror (gravity column negated).  Voxel features
        (C, nz, ny, nx) are only mirrored (their load points down).
        """
        x = features
        if x.ndim == 4:
            z = self.net(x)
            if self.mirror_average:
                xm = jnp.flip(x, axis=-1).at[-1].multiply(-1.0)  # gravity_col is last
                z = 0.5 * (z + jnp.flip(self.net(xm), axis=-1))
            return z
        square = x.shape[-1] == x.shape[-2]
        g = feature_gravity(features)
        mirror, k = jnp.asarray(False), jnp.asarray(0)
        if self.canonical:
            mirror, k = canonical_element(g, square=square)
            x = _with_gravity(transform_planes(x, mirror, k), transform_vector(g, mirror, k))
        z = self.net(x)
        if self.mirror_average:
            if self.canonical:
                s_mirror, s_k = stabiliser(transform_vector(g, mirror, k), square=square)
            else:
                s_mirror, s_k = jnp.asarray(True), jnp.asarray(0)
            gs = transform_vector(feature_gravity(x), s_mirror, s_k)
            zs = self.net(_with_gravity(transform_planes(x, s_mirror, s_k), gs))
            z = 0.5 * (z + transform_planes(zs, *inverse_element(s_mirror, s_k)))
        if self.canonical:
            z = transform_planes(z, *inverse_element(mirror, k))
        return z


def _with_gravity(x: jax.Array, g: jax.Array) -> jax.Array:
    """Features (C, h, w) with their gravity channels set to the direction g (2,)."""
    return x.at[_G_ROW].set(g[0]).at[_G_COL].set(g[1])


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


def pretrained_dir(name: str = "physics") -> pathlib.Path:
    """The folder of a built-in checkpoint (one of :data:`PRETRAINED`).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in PRETRAINED:
        raise ValueError(f"no built-in checkpoint {name!r}; built-in: {', '.join(PRETRAINED)}")
    return pathlib.Path(__file__).resolve().parent / "pretrained" / name


def load_pretrained(name: str = "physics") -> DensityNet:
    """A built-in checkpoint shipped with the package (:data:`PRETRAINED`).

    ``physics`` is the model trained against compliance alone on problems
    drawn by the v1 and v2 generators' rules, 10x10 and 20x20 (its training
    configuration and command sit beside its weights: ``config.json``,
    ``command.txt``).  float64 must be on (``sphyr_jax.enable_x64()``).
    """
    return load_checkpoint(pretrained_dir(name))


def load_model(spec) -> DensityNet:
    """A checkpoint folder, or the name of a built-in one (:data:`PRETRAINED`) when no
    folder of that name exists."""
    path = pathlib.Path(spec)
    if str(spec) in PRETRAINED and not path.is_dir():
        return load_pretrained(str(spec))
    return load_checkpoint(path)
