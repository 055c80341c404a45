"""The model mirror: one directory of weights, served read-only to every node.

The mirror is where a scheduled replica's weights come from: each node's
prestart task (``llmgw fetch``) copies a file from it into a node-local cache.
Because one file here becomes the same file on every node, the mirror is kept
by rules rather than by care:

- ``server`` serves it read-only — GET and HEAD, stated in its method table —
  so nothing that reads the mirror can replace a model in it.
- ``add`` is the only way in: whole versions appear at once, checked, under
  ``<name>/<version>/<file>`` with a ``.sha256`` beside each file, and a
  version is never replaced.
- ``usage`` answers what the catalog still uses, and refuses to answer — or
  to delete — when the catalog cannot be read.

``answer`` (Range and precondition decisions) and ``layout`` (paths, names,
checksum files) are pure; ``hub`` adapts the Hugging Face Hub for ``add`` and
for the source check (``llmgw.weights.check``).
"""
