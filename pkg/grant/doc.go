// Package grant reads and writes grant tokens. (skeleton; the grant helper writes the overview)
package grant
