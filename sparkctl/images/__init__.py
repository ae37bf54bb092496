"""Image chains: the data in ``images/<name>/`` (model), what a build would do (plan, pure), content
hashes of layer inputs, the Docker engines a build runs on, and docker-save archives (thin copies)."""
