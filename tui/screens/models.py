"""The models screen: the pair in use, the catalog's pairs and models with what is
installed and what fits, switching pairs, and downloading one (the download is the
app's, so it goes on when this screen closes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Label, ProgressBar, Static

from localspec.models.hardware import fmt_size
from localspec.models.inventory import PairStatus
from tui.listing import Listing, gather
from tui.messages import Download, Listed
from tui.pair import PairSpec

PAIR_COLUMNS = ("PAIR", "TARGET", "DRAFT", "SIZE", "INSTALLED", "FITS")
MODEL_COLUMNS = ("MODEL", "ROLE", "QUANT", "SIZE", "INSTALLED", "FITS")
# left out where the table would not fit its width (80 columns): a pair's models are then
# named on a line below it, for the highlighted pair
OPTIONAL = frozenset({"TARGET", "DRAFT", "QUANT"})


def shown(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """The columns to show: every one where they fit in `width` cells, else the ones
    that are not OPTIONAL."""
    every = range(len(columns))
    need = sum(max(len(columns[i]), *(len(r[i]) for r in rows)) + 2 for i in every)
    return list(every) if need <= width else [i for i in every if columns[i] not in OPTIONAL]


class ModelsScreen(ModalScreen[PairSpec | None]):
    """Dismisses with the PairSpec to switch to, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("enter", "use", "Use pair", priority=True),
        Binding("d", "download", "Download pair"),
        Binding("p", "planned", "Planner's pair"),
    ]

    download: reactive[Download | None] = reactive(None)
    """The app's download, mirrored here for the progress bar."""

    def __init__(self, current: PairSpec) -> None:
        super().__init__()
        self.current = current
        self.listing: Listing | None = None
        self.shown: dict[str, list[int]] = {}  # each table's columns shown

    def compose(self) -> ComposeResult:
        with Vertical(id="models-dialog", classes="dialog"):
            yield Static("Models", classes="dialog-title")
            yield Static("", id="models-machine")
            yield Static(f"In use: {self.current.label}", id="models-current", markup=False)
            yield Label("Pairs", classes="models-heading")
            yield DataTable(id="models-pairs", cursor_type="row", zebra_stripes=True)
            yield Static("", id="models-pair-models", markup=False)
            with Horizontal(id="models-download"):
                yield Label("", id="models-download-line")
                yield ProgressBar(id="models-progress", show_eta=False)
            yield Label("Catalog", classes="models-heading")
            yield DataTable(id="models-catalog", cursor_type="row", zebra_stripes=True)
            yield Static("", id="models-plan", classes="dialog-hint")
        yield Footer(compact=True)  # this screen's keys, not the chat's under it

    def on_mount(self) -> None:
        self.query_one("#models-pairs", DataTable).add_columns(*PAIR_COLUMNS)
        self.query_one("#models-catalog", DataTable).add_columns(*MODEL_COLUMNS)
        self.query_one("#models-pairs").loading = True
        self.watch(self.app, "download", self._mirror_download)
        self.refresh_listing()

    @work(thread=True, exclusive=True, exit_on_error=False, group="listing")
    def refresh_listing(self) -> None:
        try:
            listing = gather()
        except Exception as e:
            self.app.call_from_thread(
                self.app.notify, f"Could not read the catalog: {e}", severity="error"
            )
            listing = Listing("unknown machine")
        self.post_message(Listed(listing))

    def on_listed(self, message: Listed) -> None:
        self.listing = listing = message.listing
        self.query_one("#models-machine", Static).update(f"This machine: {listing.machine}")
        # the keys are in the footer
        self.query_one("#models-plan", Static).update(
            f"Planner: {listing.plan_note}" if listing.plan_note else ""
        )
        pairs = self.query_one("#models-pairs", DataTable)
        pairs.loading = False
        pairs.focus()  # it could not take the focus while loading
        self.shown.clear()
        self.call_after_refresh(self.fill_tables)  # once the table has its size back

    def on_resize(self) -> None:
        if self.listing is not None:
            self.call_after_refresh(self.fill_tables)

    def fill_tables(self) -> None:
        """Both tables' rows, in the columns that fit their width (kept where unchanged):
        once the tables are laid out (on a busy machine the refresh after the listing
        can come first, and a width of 0 would choose the compact columns for good)."""
        assert self.listing is not None
        if not all(t.size.width for t in self.query(DataTable)):
            self.call_after_refresh(self.fill_tables)
            return
        pair_rows = [
            (p.id, p.target, p.draft, fmt_size(p.size), self.installed(p), p.fits)
            for p in self.listing.pairs
        ]
        model_rows = [
            (m.id, m.role, m.quant, fmt_size(m.size), "yes" if m.installed else "-", m.fits)
            for m in self.listing.models
        ]
        keys = [p.id for p in self.listing.pairs]
        self.fill("#models-pairs", PAIR_COLUMNS, pair_rows, keys)
        self.fill("#models-catalog", MODEL_COLUMNS, model_rows, None)
        # not "-narrow": the app's breakpoints set that on every screen by the terminal's width
        self.set_class(len(self.shown["#models-pairs"]) < len(PAIR_COLUMNS), "-compact")
        self.name_pair_models()

    @staticmethod
    def installed(pair: PairStatus) -> str:
        return "yes" if pair.installed else f"{fmt_size(pair.missing)} to get"

    def fill(
        self,
        selector: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        keys: Sequence[str] | None,
    ) -> None:
        table = self.query_one(selector, DataTable)
        width = table.scrollable_content_region.width or table.size.width
        cols = shown(columns, rows, width) if rows else list(range(len(columns)))
        if self.shown.get(selector) == cols and table.row_count == len(rows):
            return
        self.shown[selector] = cols
        row = table.cursor_row
        table.clear(columns=True)
        table.add_columns(*(columns[i] for i in cols))
        for n, r in enumerate(rows):
            table.add_row(*(r[i] for i in cols), key=keys[n] if keys else None)
        if rows:
            table.move_cursor(row=min(max(row, 0), len(rows) - 1))

    @on(DataTable.RowHighlighted, "#models-pairs")
    def name_pair_models(self) -> None:
        """Where the pairs' TARGET and DRAFT are left out: the highlighted pair's models."""
        pair = self.highlighted_pair()
        line = f"{pair.target} + {pair.draft}" if pair else ""
        self.query_one("#models-pair-models", Static).update(line)

    def _mirror_download(self, download: Download | None) -> None:
        previous, self.download = self.download, download
        if (
            download is not None
            and download.finished
            and (previous is None or not previous.finished)
        ):
            self.refresh_listing()  # now installed

    def watch_download(self, download: Download | None) -> None:
        self.set_class(download is not None and not download.finished, "-downloading")
        if download is None:
            return
        bar = self.query_one(ProgressBar)
        bar.update(total=max(download.total, 1), progress=min(download.done, download.total))
        line = download.error or download.line
        self.query_one("#models-download-line", Label).update(
            f"{download.pair_id}: {line}" if line else download.pair_id
        )

    def highlighted_pair(self) -> PairStatus | None:
        if self.listing is None or not self.listing.pairs:
            return None
        table = self.query_one("#models-pairs", DataTable)
        index = table.cursor_row
        return self.listing.pairs[index] if 0 <= index < len(self.listing.pairs) else None

    def action_use(self) -> None:
        pair = self.highlighted_pair()
        if pair is None:
            return
        if not pair.installed:
            self.notify(f"{pair.id} is not installed: press d to download it.", severity="warning")
            return
        self.dismiss(pair.spec)

    def action_download(self) -> None:
        pair = self.highlighted_pair()
        if pair is None:
            return
        if pair.installed:
            self.notify(f"{pair.id} is installed already.")
            return
        self.app.start_download(pair)  # type: ignore[attr-defined]

    def action_planned(self) -> None:
        if self.listing is None or self.listing.planned is None:
            self.notify(
                self.listing.plan_note if self.listing else "Still reading the catalog.",
                severity="warning",
            )
            return
        self.dismiss(self.listing.planned)

    @on(DataTable.RowSelected, "#models-pairs")
    def _selected(self) -> None:
        self.action_use()
