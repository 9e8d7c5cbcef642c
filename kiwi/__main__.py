from kiwi.cli import main

raise SystemExit(main())
