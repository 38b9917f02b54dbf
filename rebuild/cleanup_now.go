package rebuild

// RetiredTable is the table a retired generation's rows are kept in until
// it is dropped.
func (g Generation) RetiredTable() string { return retiredName(g.PhysicalTable) }
