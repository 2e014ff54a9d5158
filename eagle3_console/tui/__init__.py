"""The console's Textual side: the App (app.py), its one screen (screen.py), its
guarded actions (guarded.py) and their dialogs (dialogs.py), the help screen
(help.py), what the screen reads of its App (host.py), its layout
(console.tcss), and the panes (panes/), which render the snapshot's model only.
No other module of the console imports Textual."""
