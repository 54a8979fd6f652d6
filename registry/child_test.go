package registry_test

// placeholder replaced by the SIGKILL drill
const childEnv = "BEACON_REGISTRY_TEST_CHILD"

func runChild() int { return 2 }
