"""What the two faces of the control plane share: the JSON API and the admin page.

``llmgw.api`` (JSON under ``/api/v1``) and ``llmgw.admin`` (server-rendered
pages under ``/admin``) are peers: neither imports the other, and neither holds
a rule of its own. What they both need lives here, with no route handler in
it:

* ``context``  — the ``AppContext`` every handler is given (configuration,
  model service, scheduler, store, source check);
* ``views``    — models and replicas as an operator needs to see them;
* ``actions``  — the changes both make the same way (adding a model with its
  source check, a rollout);
* ``identity`` — an admin token turned into the name recorded on a change.

The server assembly (``llmgw.server``) mounts both faces on one app.
"""
