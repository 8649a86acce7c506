"""localspec's terminal chat (Textual). The engine never imports this package; the app
talks to it through `localspec.session` and its event iterator only."""
