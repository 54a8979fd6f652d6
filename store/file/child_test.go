package file_test

func runChild() bool { return false }
