"""The items: directives, tools and knowledge; parsing, the item store and search, writing and validating items."""
