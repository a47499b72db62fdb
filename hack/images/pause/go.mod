module phoenix.local/pause

go 1.24
