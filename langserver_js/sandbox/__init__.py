"""The sandbox process: hosts V8 isolates for the server, one execution at a time.

Started by the server as `python -m langserver_js.sandbox '<settings JSON>'` with a
fresh environment; speaks the frames of `langserver_js.protocol` on stdin/stdout.
Importing this package does not load V8.
"""

__all__: list[str] = []
