"""The console's Textual side: the screen (screen.py), its guarded actions
(guarded.py), what the screen reads of its App (host.py) and its layout
(console.tcss). eagle3_console/app.py is the App that holds them; no other
core module imports Textual."""
