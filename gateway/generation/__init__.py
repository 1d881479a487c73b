"""The generation core both APIs share: the prompt dialog (dialog.py) and its rendering (prompt.py), CoT
recovery, request options and constraints, the plan of a turn, the turn itself (backend tokens → parsed
items, assembler.py) and the loop that runs server-side tools between turns (loop.py). It imports no API
package (responses/, chat/, conversations/): tests/gateway/test_layering.py keeps it so."""
