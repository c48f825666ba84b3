# The SPhyR environment server in a container (`docker build -t sphyr-env .`, then
# `docker run -p 8000:8000 -e SPHYR_AUTH_TOKEN=<token> sphyr-env`); `openenv build` uses it
# too.  Settings come from the environment: SPHYR_DATASET_DIR (a mounted dataset folder;
# default: the embedded v1 set), SPHYR_CACHE_DIR (a mounted folder keeping optima between
# restarts) and SPHYR_AUTH_TOKEN (a bearer token every request must present).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 JAX_PLATFORMS=cpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sphyr_jax ./sphyr_jax
RUN pip install ".[env]" && useradd --create-home sphyr
USER sphyr
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import os, urllib.request as u; \
t = os.environ.get('SPHYR_AUTH_TOKEN'); \
u.urlopen(u.Request('http://127.0.0.1:8000/health', \
headers={'Authorization': 'Bearer ' + t} if t else {}), timeout=4)"
CMD ["uvicorn", "--factory", "sphyr_jax.rl.server:app_from_environment", "--host", "0.0.0.0", "--port", "8000"]
