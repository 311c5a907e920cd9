"""The photo tab: a tab's image and selection (clicks, box, masks), Generate's form and handlers."""
