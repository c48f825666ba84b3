"""``python -m sphyr_jax <command>``: see :mod:`sphyr_jax.app.cli`."""

from sphyr_jax.app.cli import run

if __name__ == "__main__":
    run()
