"""The Python language server: runs user-written Python steps in layered sandboxes."""
