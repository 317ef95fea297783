"""The JavaScript language server: runs user-written JavaScript steps in V8 isolates."""
