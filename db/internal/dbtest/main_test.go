package dbtest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	AnnounceOptOut()
	os.Exit(m.Run())
}
