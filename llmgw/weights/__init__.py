"""Model weights: where they come from, whether they are there, and how they reach a node.

Everything that touches weights lives here, below the schedulers and the API:

* ``local``  — a source turned into a file on this machine (the embedded mode:
  a path, or a model shipped in an installed package);
* ``hub``    — the Hugging Face Hub, and its errors said the way an operator
  can act on them;
* ``gguf``   — a GGUF file's header (the model's shape, its file type, its
  chat template), from a local file or a remote one a range at a time;
* ``check``  — the source check run before a model is added: the repository,
  file or mirror URL exists and answers;
* ``layout`` — the mirror's ``<name>/<version>/<file>`` shape and the
  ``.sha256`` files beside each file, shared by the mirror and the fetcher;
* ``fetch``  — ``llmgw fetch``, the node-side download into a local cache
  (resumed, verified, one download per node);
* ``mirror`` — the read-only mirror server and the tools that fill and prune it.

Sources are parsed once, by the catalog's decoder (``llmgw.catalog.source``);
nothing here parses a source string again. Imports only run down: ``mirror``
uses ``fetch`` and ``layout``, ``fetch`` uses ``layout``, and nothing here
imports the schedulers, the gateway or the API.
"""
