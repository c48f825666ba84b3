"""mkdocs hooks (stub)."""
