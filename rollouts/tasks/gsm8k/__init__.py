"""The gsm8k family: GSM8K-style question files (one JSON object a line, `{"question": ..., "answer": "... #### 42"}`)
imported as forge tasks graded by the exact final number (kind.py; docs/tasks.md, "Adding a task format")."""
