package history

// PGArrayStatement is a write-path statement that reads its rows from
// arrays, for tests outside the package.
type PGArrayStatement struct {
	Name  string // what an error names
	SQL   string
	Width int // its parameters: one array per column
}

// PGArrayStatements returns every such statement of the PostgreSQL write
// path.
func PGArrayStatements() []PGArrayStatement {
	var out []PGArrayStatement
	for _, st := range pgRowsAll {
		out = append(out, PGArrayStatement{Name: st.name, SQL: st.arrays.sql, Width: st.width})
	}
	return out
}
