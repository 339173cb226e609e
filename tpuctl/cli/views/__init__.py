"""How each result reads for people: one module per command group, tables from views.table."""
