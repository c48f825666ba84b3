"""``python -m sphyr_jax <command>``: see :mod:`sphyr_jax.cli`."""

from sphyr_jax.cli import run

if __name__ == "__main__":
    run()
