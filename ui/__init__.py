"""The explorer's page: widgets wired to functions that live elsewhere (dynasd/explorer for sessions and decoding,
viz for figures). app.py builds it with ui.layout.build_app and launches it."""
