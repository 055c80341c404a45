# llmgw: one image for the control API and gateway (`llmgw serve`) and for the
# prestart task of every Nomad job (`llmgw fetch`), so the fetcher always
# speaks the same mirror protocol as the server that rendered the job.
#
#   docker build -t llmgw:dev .
#
# Set scheduler.nomad.fetcher_image to the tag the nodes can pull.

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY llmgw ./llmgw
# No extras: the engines run in their own images on the nodes.
RUN pip install . && rm -rf /src

# An unprivileged user. Jobs run the fetch task as this uid whatever the image says
# (scheduler.nomad.fetch_user, default 10001, declared as the task's user), and it
# writes into the host volume mounted at /llmgw-cache, whose directory on each node
# must be owned by it: Nomad never creates or chowns a host volume's path
# (`sudo install -d -o 10001 -g 10001 -m 0755 /var/lib/llmgw/model-cache`).
RUN useradd --system --uid 10001 --home-dir /var/lib/llmgw --create-home llmgw
USER llmgw
WORKDIR /var/lib/llmgw

EXPOSE 8080
# No ENTRYPOINT: a job's fetch task sets the docker driver's `command = "llmgw"`,
# which becomes the container's command and would follow an entrypoint
# (drivers/docker/driver.go, createContainerConfig), running `llmgw llmgw fetch`.
CMD ["llmgw", "serve", "--config", "/etc/llmgw/server.yaml"]
